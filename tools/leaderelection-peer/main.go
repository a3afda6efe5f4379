// Command leaderelection-peer is a candidate built on client-go's tools/leaderelection (a
// Lease object in one cluster), for benches/elect.rs to run beside `lockedjob elect` in the
// same trials and on the same local control plane. It only records: a line
// "IDENTITY UNIX_NANOS" appended to --starts each time it starts leading. SIGTERM cancels its
// context, which with --release-on-cancel gives the Lease back, as a pod's shutdown would.
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
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
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
				record(*starts, *identity)
				<-ctx.Done()
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		fail("leader election: %v", err)
	}
	elector.Run(ctx)
}

// record appends one start line; a short write would corrupt the bench's reading, so it fails.
func record(path, identity string) {
	file, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fail("open %s: %v", path, err)
	}
	defer file.Close()
	if _, err := fmt.Fprintf(file, "%s %d\n", identity, time.Now().UnixNano()); err != nil {
		fail("write %s: %v", path, err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "leaderelection-peer: "+format+"\n", args...)
	os.Exit(2)
}
