//! The lock-safety lab: runs clients against local `redis-server` nodes under a scripted fault,
//! records every lock operation and critical section, checks the history, and draws it.

pub mod harness;
