//! What every pod task of an agent shares.

use super::config::AgentConfig;
use super::logs::LogIndex;

/// What every pod task shares.
pub(crate) struct Shared {
    pub client: kube::Client,
    pub config: AgentConfig,
    pub logs: LogIndex,
}
