// Command leaderelection-peer is a candidate built on client-go's tools/leaderelection (a
// Lease object in one cluster), for benches/elect.rs to run beside `lockedjob elect` in the
// same trials and on the same local control plane. Its work only records: a line
// "IDENTITY UNIX_NANOS" appended to --starts each time it starts leading, and, while it leads,
// "IDENTITY 0 UNIX_NANOS" appended to --writes every 100 ms (0: client-go hands the work no
// fencing token). After a lost term it campaigns again, as a restarted pod would. SIGTERM
// cancels its context, which with --release-on-cancel gives the Lease back, as a pod's
// shutdown would.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster holding the Lease")
	namespace := flag.String("namespace", "default", "the Lease's namespace")
	lease := flag.String("lease", "bench", "the Lease's name")
	identity := flag.String("identity", "", "this candidate's identity (required)")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "client-go's LeaseDuration")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "client-go's RenewDeadline")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "client-go's RetryPeriod")
	releaseOnCancel := flag.Bool("release-on-cancel", true, "give the Lease back on SIGTERM")
	starts := flag.String("starts", "", "file to append \"IDENTITY UNIX_NANOS\" to on each start (required)")
	writes := flag.String("writes", "", "file to append \"IDENTITY 0 UNIX_NANOS\" to every 100 ms while leading")
	flag.Parse()
	if *identity == "" || *starts == "" {
		fail("--identity and --starts are required")
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("kubeconfig %s: %v", *kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fail("client: %v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// Like a pod that exits on lost leadership and is restarted: campaign again until SIGTERM.
	for ctx.Err() == nil {
		elect(ctx, leaderelection.LeaderElectionConfig{
			Lock: &resourcelock.LeaseLock{
				LeaseMeta:  metav1.ObjectMeta{Namespace: *namespace, Name: *lease},
				Client:     client.CoordinationV1(),
				LockConfig: resourcelock.ResourceLockConfig{Identity: *identity},
			},
			LeaseDuration:   *leaseDuration,
			RenewDeadline:   *renewDeadline,
			RetryPeriod:     *retryPeriod,
			ReleaseOnCancel: *releaseOnCancel,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					appendLine(*starts, fmt.Sprintf("%s %d", *identity, time.Now().UnixNano()))
					work(ctx, *writes, *identity)
				},
				OnStoppedLeading: func() {},
			},
		})
	}
}

// elect runs one campaign, and one term if it wins, to its end.
func elect(ctx context.Context, config leaderelection.LeaderElectionConfig) {
	elector, err := leaderelection.NewLeaderElector(config)
	if err != nil {
		fail("leader election: %v", err)
	}
	elector.Run(ctx)
}

// work writes every 100 ms until leadership ends, as a single writer would.
func work(ctx context.Context, path, identity string) {
	if path == "" {
		<-ctx.Done()
		return
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			appendLine(path, fmt.Sprintf("%s 0 %d", identity, time.Now().UnixNano()))
		}
	}
}

// appendLine appends one line; a short write would corrupt the bench's reading, so it fails.
func appendLine(path, line string) {
	file, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fail("open %s: %v", path, err)
	}
	defer file.Close()
	if _, err := fmt.Fprintln(file, line); err != nil {
		fail("write %s: %v", path, err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "leaderelection-peer: "+format+"\n", args...)
	os.Exit(2)
}
