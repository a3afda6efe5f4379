//! Command-line option groups shared by the subcommands, and their conversion into engine
//! configuration. Every option can also come from the environment, so the chart can set it.

use crate::redlock::{
    Credentials, RedlockConfig, TlsFiles, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DRIFT_FACTOR,
    DEFAULT_KEY_PREFIX, DEFAULT_RELOAD_INTERVAL, DEFAULT_REQUEST_TIMEOUT,
};
use std::path::PathBuf;
use std::time::Duration;

/// Parses `30s`, `500ms`, `1m30s`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<f64>() {
        if seconds.is_finite() && seconds >= 0.0 {
            return Ok(Duration::from_secs_f64(seconds));
        }
        return Err(format!("{text:?} is not a valid duration"));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a valid duration ({e}); use e.g. 30s, 500ms, 2m"))
}

/// How to reach the Redis nodes and how the engine treats them.
#[derive(Debug, Clone, clap::Args)]
pub struct RedisOptions {
    /// Redis node URLs, comma-separated: one per independent node (3 or 5 for production).
    #[arg(
        long = "redis",
        env = "LOCKEDJOB_REDIS_URLS",
        value_delimiter = ',',
        required = true
    )]
    pub urls: Vec<String>,
    /// Redis ACL user for every node (overrides any user in the URLs).
    #[arg(long, env = "LOCKEDJOB_REDIS_USERNAME")]
    pub redis_username: Option<String>,
    /// Redis password for every node (overrides any password in the URLs). Prefer the env var,
    /// or --redis-password-file, which can be rotated without a restart.
    #[arg(long, env = "LOCKEDJOB_REDIS_PASSWORD", hide_env_values = true)]
    pub redis_password: Option<String>,
    /// File holding the Redis password (e.g. a mounted Secret), read again when it changes:
    /// new connections use the new password, with no restart (docs/security.md, "Rotation").
    #[arg(
        long,
        env = "LOCKEDJOB_REDIS_PASSWORD_FILE",
        conflicts_with = "redis_password"
    )]
    pub redis_password_file: Option<PathBuf>,
    /// PEM CA bundle that verifies rediss:// nodes (default: the system trust store).
    #[arg(long, env = "LOCKEDJOB_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,
    /// PEM client certificate for nodes that require mutual TLS (with --redis-key-file).
    #[arg(long, env = "LOCKEDJOB_REDIS_CERT_FILE", requires = "redis_key_file")]
    pub redis_cert_file: Option<PathBuf>,
    /// PEM private key of --redis-cert-file.
    #[arg(long, env = "LOCKEDJOB_REDIS_KEY_FILE", requires = "redis_cert_file")]
    pub redis_key_file: Option<PathBuf>,
    /// Bound on each request to one node; a dead or hung node costs this much.
    #[arg(long, env = "LOCKEDJOB_REQUEST_TIMEOUT", default_value = "50ms", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// Bound on opening a connection to one node (in the background).
    #[arg(long, env = "LOCKEDJOB_CONNECT_TIMEOUT", default_value = "500ms", value_parser = parse_duration)]
    pub connect_timeout: Duration,
    /// How often the TLS files and the password file are read again for changes; 0: never.
    #[arg(long, env = "LOCKEDJOB_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub reload_interval: Duration,
    /// Share of the TTL by which node clocks may drift.
    #[arg(long, default_value_t = DEFAULT_DRIFT_FACTOR)]
    pub drift_factor: f64,
    /// Key prefix: keys are {prefix}:lock:{name} and {prefix}:fence:{name}.
    #[arg(long, env = "LOCKEDJOB_KEY_PREFIX", default_value = DEFAULT_KEY_PREFIX)]
    pub key_prefix: String,
    /// This cluster's id, the first part of every lock value.
    #[arg(long, env = "LOCKEDJOB_CLUSTER_ID", default_value = "local")]
    pub cluster_id: String,
    /// This runner's name, the second part of every lock value (the pod name in Kubernetes).
    #[arg(long, env = "POD_NAME")]
    pub runner_name: Option<String>,
}

impl RedisOptions {
    pub fn holder(&self) -> String {
        crate::redlock::holder(&self.cluster_id, self.runner_name.as_deref())
    }

    pub fn engine_config(&self) -> RedlockConfig {
        let mut config = RedlockConfig::new(
            self.urls
                .iter()
                .map(|u| u.trim().to_string())
                .filter(|u| !u.is_empty())
                .collect(),
        );
        // An empty env var (a chart value left blank) means "not set".
        let given = |path: &Option<PathBuf>| path.clone().filter(|p| !p.as_os_str().is_empty());
        config.credentials = Credentials {
            username: self.redis_username.clone().filter(|s| !s.is_empty()),
            password: self.redis_password.clone().filter(|s| !s.is_empty()),
            password_file: given(&self.redis_password_file),
        };
        config.tls = TlsFiles {
            ca_file: given(&self.redis_ca_file),
            cert_file: given(&self.redis_cert_file),
            key_file: given(&self.redis_key_file),
        };
        config.request_timeout = self.request_timeout;
        config.connect_timeout = self.connect_timeout;
        config.reload_interval = self.reload_interval;
        config.drift_factor = self.drift_factor;
        config.key_prefix = self.key_prefix.clone();
        config.holder = self.holder();
        config
    }
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            urls: Vec::new(),
            redis_username: None,
            redis_password: None,
            redis_password_file: None,
            redis_ca_file: None,
            redis_cert_file: None,
            redis_key_file: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            reload_interval: DEFAULT_RELOAD_INTERVAL,
            drift_factor: DEFAULT_DRIFT_FACTOR,
            key_prefix: DEFAULT_KEY_PREFIX.into(),
            cluster_id: "local".into(),
            runner_name: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_and_without_units() {
        let table = [
            ("30s", Ok(Duration::from_secs(30))),
            ("500ms", Ok(Duration::from_millis(500))),
            ("1m30s", Ok(Duration::from_secs(90))),
            ("2", Ok(Duration::from_secs(2))),
            ("0.25", Ok(Duration::from_millis(250))),
            ("0", Ok(Duration::ZERO)),
        ];
        for (text, expected) in table {
            assert_eq!(parse_duration(text), expected, "{text}");
        }
        for bad in ["-1", "soon", "10 parsecs", ""] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
