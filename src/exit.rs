//! The exit codes of every subcommand, in one table (sysexits where one fits), below the
//! subsystems that return them. `--help` of each subcommand and docs/cli.md, "Exit codes", say
//! which ones it uses.

/// Bad usage or configuration: a flag, a URL, a duration, a lock name (EX_USAGE).
pub const USAGE: i32 = 64;
/// A service the command needs did not answer: fewer than a quorum of Redis nodes, or the
/// Kubernetes API server (EX_UNAVAILABLE).
pub const UNAVAILABLE: i32 = 69;
/// The lock was not acquired within `--wait`: try again later (EX_TEMPFAIL).
pub const NOT_ACQUIRED: i32 = 75;
/// The lease was lost while the command ran; the command was stopped.
pub const LEASE_LOST: i32 = 76;
/// The command could not be started (as shells do for "command not found").
pub const SPAWN_FAILED: i32 = 127;
