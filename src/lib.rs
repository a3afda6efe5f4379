//! lockedjob: run each scheduled job exactly once across replicas and clusters, coordinated with
//! Redlock over independent Redis nodes and fenced with tokens that only grow.
//!
//! Layers, each depending only on those before it: [`redlock`] (the lock engine, no Kubernetes),
//! [`child`] (a command that cannot outlive its supervisor), [`exec`] (run a command under a
//! lock), [`elect`] (leader election for a long-running command).

pub mod api;
pub mod backfill;
pub mod child;
pub mod controller;
pub mod elect;
pub mod exec;
pub mod http;
pub mod lab;
pub mod metrics;
pub mod next;
pub mod options;
pub mod redlock;
pub mod schedule;
pub mod shutdown;
pub mod status;
