//! The command-line front-ends, one module a subcommand (the operator's is `controller`, the
//! lab's `lab`), and the exit codes they share. `src/main.rs` parses and dispatches only.

pub mod backfill;
pub mod exec;
pub mod exit;
pub mod next;
pub mod status;
