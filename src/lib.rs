//! lockedjob: run each scheduled job exactly once across replicas and clusters, coordinated with
//! Redlock over independent Redis nodes and fenced with tokens that only grow.
//!
//! Layers, each depending only on those before it: [`redlock`] (the lock engine, the crate
//! `lockedjob-redlock`, re-exported here; no Kubernetes),
//! [`child`] (a command that cannot outlive its supervisor), [`elect`] (leader election, and
//! the lease runner `exec` shares), [`cli`] (the other subcommands: `exec` runs a command under
//! a lock).

pub mod api;
pub mod child;
pub mod cli;
pub mod controller;
pub mod elect;
pub mod exit;
pub mod http;
pub mod lab;
pub mod metrics;
pub mod options;
pub use lockedjob_redlock as redlock;
pub mod schedule;
pub mod shutdown;
