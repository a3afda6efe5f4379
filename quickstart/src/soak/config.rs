//! What a soak is asked for, and what every part of it shares.

use std::path::PathBuf;

/// A node's restart delay, as `start-redis.sh` has it: longer than any lease it voted for.
pub const RESTART_DELAY_MS: u64 = 12_000;
pub const CLUSTERS: [&str; 2] = ["east", "west"];
pub const REPLICAS: usize = 3;

pub struct Options {
    pub seconds: u64,
    pub seed: u64,
    pub out: PathBuf,
    /// The deliberately broken deployment: each cluster its own five nodes, so both run every
    /// time. Both checkers must object.
    pub split_nodes: bool,
    /// The deliberately broken build of the work: the store takes every write, whatever its
    /// token (fencing off). With `split_nodes`, both checkers must object to the writes too.
    pub unfenced_store: bool,
    /// `tools/porcupine-check`; without it only our checker judges.
    pub porcupine_check: Option<PathBuf>,
}

pub fn say(text: impl std::fmt::Display) {
    eprintln!("[soak] {text}");
}
