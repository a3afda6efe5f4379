//! The command-line front-ends, one module a subcommand (the operator's is `controller`, the
//! lab's `lab`, leader election's `elect`; the exit codes they share are `crate::exit`).
//! `src/main.rs` parses and dispatches only.

pub mod backfill;
pub mod exec;
pub mod next;
pub mod status;
