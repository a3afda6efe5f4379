//! The node's network: a network namespace of its own (`lj<N>`) joined to the host by a veth
//! pair, with the pods' bridge inside it. Everything the node changes in the network (its
//! iptables chains, its bridge, its forwarding) lives in that namespace and goes with it, so
//! two clusters' kube-proxies never meet. On the host there are only the veth's end, two
//! routes (pods and Services, through the node) and rules that drop anything forwarded to or
//! from the node: the host never routes a pod's packet off the machine, and inside the node
//! there is no default route.

use crate::Error;
use std::fs::File;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

/// Up to this many real nodes on one machine.
const MAX_NODES: u8 = 32;

/// The addresses of node `index`.
#[derive(Debug, Clone, Copy)]
pub struct Subnets {
    pub index: u8,
}

impl Subnets {
    pub fn netns(&self) -> String {
        format!("lj{}", self.index)
    }
    fn host_link(&self) -> String {
        format!("lj{}h", self.index)
    }
    fn node_link(&self) -> String {
        format!("lj{}n", self.index)
    }
    /// The host's end of the link: where the API server listens for this cluster.
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 250, self.index, 1)
    }
    /// The node's address (the kubelet's endpoint).
    pub fn node_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 250, self.index, 2)
    }
    pub fn pod_cidr(&self) -> String {
        format!("10.244.{}.0/24", self.index)
    }
    pub fn pod_gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, self.index, 1)
    }
    pub fn service_cidr(&self) -> String {
        format!("10.96.{}.0/24", self.index)
    }
    /// The `kubernetes` Service's address.
    pub fn apiserver_service_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 96, self.index, 1)
    }
    pub fn dns_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 96, self.index, 10)
    }
}

/// Runs a command that must succeed; its stderr becomes the error.
pub fn run(program: &str, args: &[&str]) -> Result<(), Error> {
    let output = Command::new(program).args(args).output().map_err(|e| {
        Error::Host(format!(
            "run {program}: {e} (is it installed? scripts/deps.sh)"
        ))
    })?;
    if output.status.success() {
        return Ok(());
    }
    Err(Error::Host(format!(
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

/// The host's FORWARD rules for a node: nothing crosses between the node and any other
/// interface, even where the host forwards packets.
fn forward_rules(subnets: &Subnets) -> [Vec<String>; 2] {
    let link = subnets.host_link();
    let comment = format!(
        "localcluster {}: no packet leaves the machine",
        subnets.netns()
    );
    [
        [
            "-i",
            &link,
            "-m",
            "comment",
            "--comment",
            &comment,
            "-j",
            "DROP",
        ],
        [
            "-o",
            &link,
            "-m",
            "comment",
            "--comment",
            &comment,
            "-j",
            "DROP",
        ],
    ]
    .map(|rule| rule.iter().map(|s| s.to_string()).collect())
}

/// The node's network namespace and link; `host::release` removes them.
#[derive(Debug)]
pub struct NodeNetwork {
    pub subnets: Subnets,
}

impl NodeNetwork {
    /// Takes the first free index (creating `lj<N>` is what claims it) and sets the network
    /// up.
    pub fn create() -> Result<Self, Error> {
        let index = (0..MAX_NODES)
            .find(|i| run("ip", &["netns", "add", &Subnets { index: *i }.netns()]).is_ok())
            .ok_or_else(|| {
                Error::Host(format!(
                    "all {MAX_NODES} node network namespaces lj0..lj{} exist: stop a cluster, or remove stale ones with `ip netns del`",
                    MAX_NODES - 1
                ))
            })?;
        let network = Self {
            subnets: Subnets { index },
        };
        if let Err(e) = network.configure() {
            remove_network(&network.subnets);
            return Err(e);
        }
        Ok(network)
    }

    fn configure(&self) -> Result<(), Error> {
        let s = &self.subnets;
        let (ns, host, node) = (s.netns(), s.host_link(), s.node_link());
        let host_addr = format!("{}/30", s.host_ip());
        let node_addr = format!("{}/30", s.node_ip());
        let via = s.node_ip().to_string();
        run(
            "ip",
            &[
                "link", "add", &host, "type", "veth", "peer", "name", &node, "netns", &ns,
            ],
        )?;
        run("ip", &["addr", "add", &host_addr, "dev", &host])?;
        run("ip", &["link", "set", &host, "up"])?;
        run("ip", &["-n", &ns, "addr", "add", &node_addr, "dev", &node])?;
        run("ip", &["-n", &ns, "link", "set", &node, "up"])?;
        run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
        for cidr in [s.pod_cidr(), s.service_cidr()] {
            run("ip", &["route", "add", &cidr, "via", &via, "dev", &host])?;
        }
        // Inside the node only (these sysctls are per network namespace): it routes between
        // its link and the pods' bridge, and bridged traffic passes iptables, so a pod reaching
        // a Service backed by a pod on the same bridge gets its reply un-NATed.
        run(
            "ip",
            &[
                "netns",
                "exec",
                &ns,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
                "net.bridge.bridge-nf-call-iptables=1",
            ],
        )?;
        for rule in forward_rules(s) {
            let mut args = vec!["-w", "-I", "FORWARD"];
            args.extend(rule.iter().map(String::as_str));
            run("iptables", &args)?;
        }
        Ok(())
    }

    /// The namespace's file, for `setns` in the node's processes.
    pub fn netns_file(&self) -> Result<File, Error> {
        File::open(self.netns_path()).map_err(|e| Error::io("open the node's network namespace", e))
    }

    fn netns_path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(self.subnets.netns())
    }
}

/// Removes the host's rules and the namespace (its link, routes, bridge and iptables go
/// with it, once no process is left inside). Errors are reported, not returned.
pub fn remove_network(subnets: &Subnets) {
    for rule in forward_rules(subnets) {
        let mut args = vec!["-w", "-D", "FORWARD"];
        args.extend(rule.iter().map(String::as_str));
        // Absent already (never added, or removed by an earlier clean-up): nothing to do.
        let _ = run("iptables", &args);
    }
    // The namespace is torn down asynchronously after its last user; deleting the link now
    // frees its name for the next node at once (deleting one end of a veth deletes both).
    let _ = run("ip", &["link", "del", &subnets.host_link()]);
    if let Err(e) = run("ip", &["netns", "del", &subnets.netns()]) {
        eprintln!("localcluster: remove the node's network namespace: {e}");
    }
}
