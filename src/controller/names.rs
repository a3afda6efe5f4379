//! The names the operator goes by on the API server.

/// Finalizer on every LockedJob: on delete, its Jobs are stopped and its lock released first.
pub const FINALIZER: &str = "lockedjob.dev/cleanup";
/// Field manager and event reporter name.
pub const MANAGER: &str = "lockedjob-operator";
