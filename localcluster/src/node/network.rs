//! The nodes' network. Cluster N's first node lives in a network namespace of its own
//! (`ljN`), joined to the host by a veth pair; each further node k in `ljN-k`, joined to `ljN`,
//! which routes between them. Each node's pods sit on a bridge inside its namespace. Everything
//! the nodes change in the network (iptables chains, bridges, forwarding) lives in those
//! namespaces and goes with them, so two clusters' kube-proxies never meet. On the host there
//! are only the veth's end, routes to the cluster's pods, Services and nodes (through `ljN`),
//! and rules that drop anything forwarded to or from the link: the host never routes a pod's
//! packet off the machine, and `ljN` has no default route.

use crate::Error;
use std::fs::File;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

/// Up to this many clusters with real nodes on one machine.
const MAX_CLUSTERS: u8 = 32;
/// Up to this many nodes in one cluster.
pub const MAX_NODES: u8 = 16;

/// The addresses of cluster `index`.
#[derive(Debug, Clone, Copy)]
pub struct Subnets {
    pub index: u8,
}

impl Subnets {
    /// The first node's namespace, which also routes for the others.
    pub fn netns(&self) -> String {
        format!("lj{}", self.index)
    }
    fn host_link(&self) -> String {
        format!("lj{}h", self.index)
    }
    /// The host's end of the link: where the API server listens for this cluster.
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 250, self.index, 1)
    }
    /// Every node's pods: node k has `10.(100+N).k.0/24`.
    fn pod_range(&self) -> String {
        format!("10.{}.0.0/16", 100 + u16::from(self.index))
    }
    /// The links between the first node and the others.
    fn node_link_range(&self) -> String {
        format!("10.251.{}.0/24", self.index)
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
    /// Where kube-proxy sees the cluster's pods.
    pub fn cluster_cidr(&self) -> String {
        self.pod_range()
    }
    pub fn node(&self, k: u8) -> NodeSlot {
        NodeSlot {
            index: self.index,
            k,
        }
    }
}

/// Node k of cluster `index`.
#[derive(Debug, Clone, Copy)]
pub struct NodeSlot {
    pub index: u8,
    pub k: u8,
}

impl NodeSlot {
    pub fn netns(&self) -> String {
        match self.k {
            0 => format!("lj{}", self.index),
            k => format!("lj{}-{k}", self.index),
        }
    }
    /// The node's address (the kubelet's endpoint).
    pub fn node_ip(&self) -> Ipv4Addr {
        match self.k {
            0 => Ipv4Addr::new(10, 250, self.index, 2),
            k => Ipv4Addr::new(10, 251, self.index, 4 * k + 2),
        }
    }
    /// The first node's end of this node's link (nodes after the first).
    fn router_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 251, self.index, 4 * self.k + 1)
    }
    fn router_link(&self) -> String {
        format!("lj{}r{}", self.index, self.k)
    }
    fn node_link(&self) -> String {
        format!("lj{}n{}", self.index, self.k)
    }
    pub fn pod_cidr(&self) -> String {
        format!("10.{}.{}.0/24", 100 + u16::from(self.index), self.k)
    }
    pub fn pod_gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 100 + self.index, self.k, 1)
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
    ["-i", "-o"].map(|direction| {
        [
            direction,
            &link,
            "-m",
            "comment",
            "--comment",
            &comment,
            "-j",
            "DROP",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    })
}

/// The nodes' namespaces and links; `host::release` removes them.
#[derive(Debug)]
pub struct NodeNetwork {
    pub subnets: Subnets,
    pub nodes: u8,
}

impl NodeNetwork {
    /// Takes the first free cluster index (creating `ljN` is what claims it) and sets up the
    /// network of `nodes` nodes.
    pub fn create(nodes: u8) -> Result<Self, Error> {
        if !(1..=MAX_NODES).contains(&nodes) {
            return Err(Error::Host(format!(
                "{nodes} nodes: a cluster has 1 to {MAX_NODES}"
            )));
        }
        let index = (0..MAX_CLUSTERS)
            .find(|i| run("ip", &["netns", "add", &Subnets { index: *i }.netns()]).is_ok())
            .ok_or_else(|| {
                Error::Host(format!(
                    "all {MAX_CLUSTERS} node network namespaces lj0..lj{} exist: stop a cluster, or remove stale ones with `ip netns del`",
                    MAX_CLUSTERS - 1
                ))
            })?;
        let network = Self {
            subnets: Subnets { index },
            nodes,
        };
        let configured = network
            .link_first_node()
            .and_then(|()| (1..nodes).try_for_each(|k| network.link_node(k)));
        if let Err(e) = configured {
            remove_network(&network.subnets);
            return Err(e);
        }
        Ok(network)
    }

    fn link_first_node(&self) -> Result<(), Error> {
        let s = &self.subnets;
        let first = s.node(0);
        let (ns, host, node) = (s.netns(), s.host_link(), format!("lj{}n0", s.index));
        let via = first.node_ip().to_string();
        run(
            "ip",
            &[
                "link", "add", &host, "type", "veth", "peer", "name", &node, "netns", &ns,
            ],
        )?;
        run(
            "ip",
            &["addr", "add", &format!("{}/30", s.host_ip()), "dev", &host],
        )?;
        run("ip", &["link", "set", &host, "up"])?;
        run(
            "ip",
            &["-n", &ns, "addr", "add", &format!("{via}/30"), "dev", &node],
        )?;
        run("ip", &["-n", &ns, "link", "set", &node, "up"])?;
        for cidr in [s.pod_range(), s.service_cidr(), s.node_link_range()] {
            run("ip", &["route", "add", &cidr, "via", &via, "dev", &host])?;
        }
        prepare_namespace(&ns)?;
        for rule in forward_rules(s) {
            let mut args = vec!["-w", "-I", "FORWARD"];
            args.extend(rule.iter().map(String::as_str));
            run("iptables", &args)?;
        }
        Ok(())
    }

    /// Node k (after the first): its namespace, a link to the first node, a default route
    /// through it (which has none of its own), and the first node's route to its pods.
    fn link_node(&self, k: u8) -> Result<(), Error> {
        let slot = self.subnets.node(k);
        let (router_ns, ns) = (self.subnets.netns(), slot.netns());
        let (router_link, node_link) = (slot.router_link(), slot.node_link());
        run("ip", &["netns", "add", &ns])?;
        run(
            "ip",
            &[
                "-n",
                &router_ns,
                "link",
                "add",
                &router_link,
                "type",
                "veth",
                "peer",
                "name",
                &node_link,
                "netns",
                &ns,
            ],
        )?;
        let router_addr = format!("{}/30", slot.router_ip());
        let node_addr = format!("{}/30", slot.node_ip());
        run(
            "ip",
            &[
                "-n",
                &router_ns,
                "addr",
                "add",
                &router_addr,
                "dev",
                &router_link,
            ],
        )?;
        run("ip", &["-n", &router_ns, "link", "set", &router_link, "up"])?;
        run(
            "ip",
            &["-n", &ns, "addr", "add", &node_addr, "dev", &node_link],
        )?;
        run("ip", &["-n", &ns, "link", "set", &node_link, "up"])?;
        let router = slot.router_ip().to_string();
        run(
            "ip",
            &["-n", &ns, "route", "add", "default", "via", &router],
        )?;
        let node = slot.node_ip().to_string();
        run(
            "ip",
            &[
                "-n",
                &router_ns,
                "route",
                "add",
                &slot.pod_cidr(),
                "via",
                &node,
            ],
        )?;
        prepare_namespace(&ns)
    }

    /// Node k's namespace file, for `setns` in its processes.
    pub fn netns_file(&self, k: u8) -> Result<File, Error> {
        File::open(PathBuf::from("/run/netns").join(self.subnets.node(k).netns()))
            .map_err(|e| Error::io("open a node's network namespace", e))
    }
}

/// Loopback up; forwarding on, and bridged traffic through iptables, so a pod reaching a
/// Service backed by a pod on the same bridge gets its reply un-NATed. These sysctls are per
/// network namespace: the host's stay as they were.
fn prepare_namespace(ns: &str) -> Result<(), Error> {
    run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
    run(
        "ip",
        &[
            "netns",
            "exec",
            ns,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
            "net.bridge.bridge-nf-call-iptables=1",
        ],
    )
}

/// The cluster's namespaces: `ljN` and `ljN-k`.
pub fn namespaces(subnets: &Subnets) -> Vec<String> {
    let first = subnets.netns();
    let prefix = format!("{first}-");
    std::fs::read_dir("/run/netns")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|name| *name == first || name.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes the host's rules and the cluster's namespaces (links, routes, bridges and iptables
/// go with them, once no process is left inside). Errors are reported, not returned.
pub fn remove_network(subnets: &Subnets) {
    for rule in forward_rules(subnets) {
        let mut args = vec!["-w", "-D", "FORWARD"];
        args.extend(rule.iter().map(String::as_str));
        // Absent already (never added, or removed by an earlier clean-up): nothing to do.
        let _ = run("iptables", &args);
    }
    // A namespace is torn down asynchronously after its last user; deleting the link now
    // frees its name for the next cluster at once (deleting one end of a veth deletes both).
    let _ = run("ip", &["link", "del", &subnets.host_link()]);
    for ns in namespaces(subnets) {
        if let Err(e) = run("ip", &["netns", "del", &ns]) {
            eprintln!("localcluster: remove network namespace {ns}: {e}");
        }
    }
}
