//! lockedjob: run each scheduled job exactly once across replicas and clusters, coordinated with
//! Redlock over independent Redis nodes and fenced with tokens that only grow.
//!
//! Layers, each depending only on those before it: [`redlock`] (the lock engine, no Kubernetes),
//! [`exec`] (run a command under a lock).

pub mod api;
pub mod backfill;
pub mod controller;
pub mod exec;
pub mod lab;
pub mod metrics;
pub mod next;
pub mod options;
pub mod redlock;
pub mod schedule;
pub mod shutdown;
pub mod status;
