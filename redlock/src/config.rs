//! Engine configuration and its validation. Everything a user can get wrong is caught here,
//! before any node is contacted, with an error that says how to fix it.

use super::error::ConfigError;
use super::timing::drift_allowance;
use super::tls::TlsFiles;
use redis::{ConnectionAddr, IntoConnectionInfo};
use std::path::PathBuf;
use std::time::Duration;

/// Defaults of the protocol (docs/design.md).
/// This one is the default [`RedlockConfig::request_timeout`]: the bound on each request to
/// one node.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_millis(50);
/// The default [`RedlockConfig::connect_timeout`]: the bound on opening a connection to a node.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// The default [`RedlockConfig::drift_factor`]: node clocks may run up to 1 % fast.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// The default [`RedlockConfig::key_prefix`].
pub const DEFAULT_KEY_PREFIX: &str = "lockedjob";
/// A lease TTL for callers that name none (`lockedjob exec`); the engine itself takes the TTL
/// on every call and does not use this.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// How often the TLS and password files are read again: a Secret mounted as a volume changes
/// within about a minute of its update (the kubelet's sync period), so this adds little.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// Credentials applied to every node, overriding any in the URLs (e.g. from a Secret via env).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// The user for AUTH (a Redis ACL user), in place of the URLs' own; `None` keeps theirs.
    pub username: Option<String>,
    /// The password for AUTH, in place of the URLs' own; `None` keeps theirs. Ignored when
    /// `password_file` is given.
    pub password: Option<String>,
    /// A file holding the password (a mounted Secret), read again when it changes, so that a
    /// password can be rotated without a restart. Takes the place of `password`.
    pub password_file: Option<PathBuf>,
}

impl Credentials {
    /// The password to use now: the file's first line when a file is given.
    fn current_password(&self) -> Result<Option<String>, ConfigError> {
        let Some(path) = &self.password_file else {
            return Ok(self.password.clone());
        };
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::PasswordFile {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        // `echo secret > file` and a Secret made from such a file end in a newline that is
        // not part of the password.
        let password = text.trim_end_matches(['\n', '\r']);
        if password.is_empty() {
            return Err(ConfigError::PasswordFile {
                path: path.display().to_string(),
                reason: "it is empty".into(),
            });
        }
        Ok(Some(password.to_string()))
    }
}

/// How the engine talks to its nodes and retries.
#[derive(Debug, Clone)]
pub struct RedlockConfig {
    /// One URL per independent Redis node: `redis://[user:pass@]host:port[/db]` or `rediss://`.
    pub nodes: Vec<String>,
    /// Credentials for every node, overriding those in the URLs.
    pub credentials: Credentials,
    /// CA bundle and client certificate for `rediss://` nodes.
    pub tls: TlsFiles,
    /// Bound on each request to one node. A dead or hung node costs this much, never more.
    pub request_timeout: Duration,
    /// Bound on establishing a connection. A node's first request waits for it (a one-shot
    /// program has nothing else to wait for); later ones open in the background, so a slow
    /// handshake delays nothing beyond one request timeout.
    pub connect_timeout: Duration,
    /// Share of the TTL by which node clocks may run fast.
    pub drift_factor: f64,
    /// Extra attempts `acquire` makes after the first (bounded also by its wait limit).
    pub retry_count: u32,
    /// Full-jitter backoff between attempts: uniform in `[0, min(max, base * 2^n)]`.
    pub retry_base_delay: Duration,
    /// Upper bound of the backoff between attempts (the `max` above).
    pub retry_max_delay: Duration,
    /// Keys are `{prefix}:lock:{name}` and `{prefix}:fence:{name}`.
    pub key_prefix: String,
    /// How often the TLS files and the password file are read again for changes (`reload.rs`);
    /// zero: never.
    pub reload_interval: Duration,
    /// First part of every lock value, `{clusterId}/{podName}`: says who holds a lock.
    pub holder: String,
}

impl RedlockConfig {
    /// A configuration for `nodes` with the defaults: the `DEFAULT_*` timeouts, drift factor,
    /// key prefix and reload interval, 3 retries with a backoff of 50 ms to 1 s, and
    /// [`default_holder`] as holder. Nothing is checked until
    /// [`Redlock::new`](crate::Redlock::new).
    pub fn new(nodes: Vec<String>) -> Self {
        Self {
            nodes,
            credentials: Credentials::default(),
            tls: TlsFiles::default(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            drift_factor: DEFAULT_DRIFT_FACTOR,
            retry_count: 3,
            retry_base_delay: Duration::from_millis(50),
            retry_max_delay: Duration::from_secs(1),
            key_prefix: DEFAULT_KEY_PREFIX.to_string(),
            reload_interval: DEFAULT_RELOAD_INTERVAL,
            holder: default_holder(),
        }
    }

    /// The files read again for changes: the TLS files and the password file that were given.
    pub(crate) fn watched_files(&self) -> Vec<PathBuf> {
        [
            &self.tls.ca_file,
            &self.tls.cert_file,
            &self.tls.key_file,
            &self.credentials.password_file,
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
    }

    /// Checks the configuration and parses every node address, reading the TLS and password
    /// files as they are now.
    pub(crate) fn parse_nodes(&self) -> Result<Vec<ParsedNode>, ConfigError> {
        if self.nodes.is_empty() {
            return Err(ConfigError::NoNodes);
        }
        if self.request_timeout.is_zero() {
            return Err(ConfigError::ZeroRequestTimeout);
        }
        if !(0.0..=0.5).contains(&self.drift_factor) || self.drift_factor.is_nan() {
            return Err(ConfigError::BadDriftFactor(self.drift_factor.to_string()));
        }
        if self.key_prefix.is_empty() || self.key_prefix.chars().any(char::is_whitespace) {
            return Err(ConfigError::BadPrefix(self.key_prefix.clone()));
        }
        let tls = if self.tls.is_empty() {
            None
        } else {
            Some(self.tls.load()?)
        };
        let password = self.credentials.current_password()?;
        let mut parsed: Vec<ParsedNode> = Vec::with_capacity(self.nodes.len());
        for url in &self.nodes {
            let mut node = parse_node(
                url,
                self.credentials.username.as_deref(),
                password.as_deref(),
            )?;
            if parsed.iter().any(|p| p.label == node.label) {
                return Err(ConfigError::DuplicateNode { node: node.label });
            }
            if let Some(certificates) = &tls {
                if !node.label.starts_with("rediss://") {
                    return Err(ConfigError::TlsFilesWithPlainNode { node: node.label });
                }
                node.tls = Some(certificates.clone());
            }
            parsed.push(node);
        }
        Ok(parsed)
    }
}

/// `{clusterId}/{podName}` from the environment the operator and `exec` run in.
pub fn default_holder() -> String {
    let cluster = std::env::var("LOCKEDJOB_CLUSTER_ID").unwrap_or_else(|_| "local".into());
    holder(&cluster, std::env::var("POD_NAME").ok().as_deref())
}

/// `{clusterId}/{runner}`: the runner's name, else this host's, else this process's id. The
/// one place a holder is spelled, for the operator, `exec` and the engine's default alike.
pub fn holder(cluster_id: &str, runner: Option<&str>) -> String {
    let runner = runner
        .filter(|r| !r.is_empty())
        .map(str::to_string)
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| format!("pid-{}", std::process::id()));
    format!("{cluster_id}/{runner}")
}

/// Splits `a,b , c` (as in `--redis` or `LOCKEDJOB_REDIS_URLS`) into URLs.
pub fn split_node_list(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

#[derive(Debug, Clone)]
pub(crate) struct ParsedNode {
    /// Address without credentials, safe to log.
    pub label: String,
    pub info: redis::ConnectionInfo,
    /// CA and client certificate, when given; else the system trust store verifies the node.
    pub tls: Option<redis::TlsCertificates>,
}

fn parse_node(
    url: &str,
    username: Option<&str>,
    password: Option<&str>,
) -> Result<ParsedNode, ConfigError> {
    let bad = |reason: &str| ConfigError::BadUrl {
        url: redact(url),
        reason: reason.to_string(),
    };
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err(bad("the scheme must be redis:// or rediss://"));
    }
    let info = url
        .into_connection_info()
        .map_err(|e| bad(&e.to_string()))?;
    let (scheme, host, port) = match info.addr() {
        ConnectionAddr::Tcp(host, port) => ("redis", host.clone(), *port),
        ConnectionAddr::TcpTls { insecure: true, .. } => {
            return Err(bad("certificate verification cannot be turned off (#insecure): a node anyone can impersonate could grant the lock to two runners; give the node's CA with --redis-ca-file or LOCKEDJOB_REDIS_CA_FILE"));
        }
        ConnectionAddr::TcpTls { host, port, .. } => ("rediss", host.clone(), *port),
        _ => return Err(bad("only TCP addresses are supported")),
    };
    if host.is_empty() {
        return Err(bad("the host is missing"));
    }
    let mut settings = info.redis_settings().clone();
    if let Some(user) = username {
        settings = settings.set_username(user);
    }
    if let Some(password) = password {
        settings = settings.set_password(password);
    }
    let label = format!("{scheme}://{host}:{port}/{}", settings.db());
    Ok(ParsedNode {
        label,
        info: info.set_redis_settings(settings),
        tls: None,
    })
}

/// Hides the credentials of a URL for error messages: everything before the last `@`, after
/// the scheme when the scheme comes first, whatever else the text looks like.
fn redact(url: &str) -> String {
    let Some(at) = url.rfind('@') else {
        return url.to_string();
    };
    // Only a real scheme (letters, digits, + . -) stays visible; anything else before the
    // '@' may be credentials.
    let start = url
        .find("://")
        .filter(|&scheme_end| {
            scheme_end < at
                && url[..scheme_end]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        })
        .map_or(0, |scheme_end| scheme_end + 3);
    format!("{}***@{}", &url[..start], &url[at + 1..])
}

/// Lease timing: TTL, how often the watchdog renews, and how long before the deadline it gives
/// up. Validated together because each bound depends on the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// The lease TTL, which the two others are checked against: acquire with it (the watchdog
    /// renews each lease by that lease's own TTL).
    pub ttl: Duration,
    /// How often the watchdog renews the lease.
    pub renew_interval: Duration,
    /// How long before the lease's deadline the watchdog declares the lease lost, if no
    /// renewal has pushed the deadline out by then.
    pub safety_margin: Duration,
}

impl LeaseTiming {
    /// Defaults from a TTL: renew every ttl/3, give up ttl/10 (at most 2 s) before the deadline.
    pub fn from_ttl(ttl: Duration) -> Self {
        Self {
            ttl,
            renew_interval: ttl / 3,
            safety_margin: (ttl / 10).min(Duration::from_secs(2)),
        }
    }

    /// [`LeaseTiming::from_ttl`] with the intervals a user gave in place of the defaults.
    pub fn from_ttl_or(
        ttl: Duration,
        renew_interval: Option<Duration>,
        safety_margin: Option<Duration>,
    ) -> Self {
        let defaults = Self::from_ttl(ttl);
        Self {
            ttl,
            renew_interval: renew_interval.unwrap_or(defaults.renew_interval),
            safety_margin: safety_margin.unwrap_or(defaults.safety_margin),
        }
    }

    /// Checks that TTL, renew interval and safety margin fit together for an engine whose
    /// drift factor is `drift_factor`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroTtl`] for a zero TTL; [`ConfigError::TtlTooShort`] for a TTL under
    /// 100 ms or at most twice the drift allowance; [`ConfigError::RenewNotBelowTtl`] for a
    /// renew interval of zero or not below the TTL; [`ConfigError::MarginTooLarge`] when the
    /// safety margin, the renew interval and the drift allowance together reach the TTL.
    pub fn validate(&self, drift_factor: f64) -> Result<(), ConfigError> {
        if self.ttl.is_zero() {
            return Err(ConfigError::ZeroTtl);
        }
        let drift = drift_allowance(self.ttl, drift_factor);
        if self.ttl < Duration::from_millis(100) || self.ttl <= drift * 2 {
            return Err(ConfigError::TtlTooShort {
                ttl: self.ttl,
                drift,
            });
        }
        if self.renew_interval.is_zero() || self.renew_interval >= self.ttl {
            return Err(ConfigError::RenewNotBelowTtl {
                renew: self.renew_interval,
                ttl: self.ttl,
            });
        }
        if self.safety_margin + self.renew_interval + drift >= self.ttl {
            return Err(ConfigError::MarginTooLarge {
                margin: self.safety_margin,
                renew: self.renew_interval,
                ttl: self.ttl,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(nodes: &[&str]) -> RedlockConfig {
        RedlockConfig::new(nodes.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn node_lists_are_checked() {
        let table: &[(&[&str], Result<usize, &str>)] = &[
            (&[], Err("no Redis nodes")),
            (&["redis://127.0.0.1:1"], Ok(1)),
            (&["redis://a:1", "rediss://b:2", "redis://u:p@c:3/2"], Ok(3)),
            (&["http://a:1"], Err("scheme must be redis://")),
            (&["redis://a:1", "redis://a:1"], Err("listed twice")),
            (&["redis://:secret@a:notaport"], Err("not valid")),
            // Found by the redis_url fuzzer: "://" after the '@' left the password shown.
            (
                &["rfie:s//a:6380/secret123@b:6380/:s//a:63://x"],
                Err("scheme"),
            ),
        ];
        for (nodes, expected) in table {
            let got = config(nodes).parse_nodes();
            match (got, expected) {
                (Ok(parsed), Ok(n)) => assert_eq!(parsed.len(), *n, "{nodes:?}"),
                (Err(e), Err(fragment)) => {
                    let text = e.to_string();
                    assert!(text.contains(fragment), "{nodes:?}: {text}");
                    assert!(!text.contains("secret"), "password leaked: {text}");
                }
                (got, expected) => panic!("{nodes:?}: got {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn labels_hide_credentials_and_credentials_override() {
        let mut cfg = config(&["redis://alice:s3cret@10.0.0.1:6380/1"]);
        cfg.credentials.password = Some("fromenv".into());
        let parsed = cfg.parse_nodes().unwrap();
        assert_eq!(parsed[0].label, "redis://10.0.0.1:6380/1");
        assert_eq!(parsed[0].info.redis_settings().password(), Some("fromenv"));
        assert_eq!(parsed[0].info.redis_settings().username(), Some("alice"));
    }

    #[test]
    fn a_password_file_takes_the_place_of_the_password() {
        let dir = std::env::temp_dir().join(format!("lockedjob-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        let with_file = |contents: Option<&str>| {
            match contents {
                Some(text) => std::fs::write(&file, text).unwrap(),
                None => {
                    let _ = std::fs::remove_file(&file);
                }
            }
            let mut cfg = config(&["redis://:inurl@a:1"]);
            cfg.credentials.password = Some("given".into());
            cfg.credentials.password_file = Some(file.clone());
            cfg.parse_nodes()
                .map(|parsed| parsed[0].info.redis_settings().password().map(String::from))
                .map_err(|e| e.to_string())
        };
        assert_eq!(with_file(Some("s3cret\n")), Ok(Some("s3cret".into())));
        assert_eq!(
            with_file(Some("with space\r\n")),
            Ok(Some("with space".into()))
        );
        let empty = with_file(Some("\n")).unwrap_err();
        assert!(
            empty.contains("is empty") && empty.contains("password"),
            "{empty}"
        );
        let missing = with_file(None).unwrap_err();
        assert!(missing.contains(&file.display().to_string()), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_engine_settings_are_refused() {
        let mut cfg = config(&["redis://a:1"]);
        cfg.request_timeout = Duration::ZERO;
        assert_eq!(
            cfg.parse_nodes().unwrap_err(),
            ConfigError::ZeroRequestTimeout
        );
        let mut cfg = config(&["redis://a:1"]);
        cfg.drift_factor = 0.9;
        assert!(matches!(
            cfg.parse_nodes(),
            Err(ConfigError::BadDriftFactor(_))
        ));
        let mut cfg = config(&["redis://a:1"]);
        cfg.key_prefix = "a b".into();
        assert!(matches!(cfg.parse_nodes(), Err(ConfigError::BadPrefix(_))));
    }

    #[test]
    fn lease_timing_rules() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let t = |ttl, renew, margin| LeaseTiming {
            ttl,
            renew_interval: renew,
            safety_margin: margin,
        };
        let table = [
            (LeaseTiming::from_ttl(s(30)), None),
            (LeaseTiming::from_ttl(ms(300)), None),
            (t(s(0), s(0), s(0)), Some("greater than zero")),
            (t(ms(50), ms(10), ms(1)), Some("at least 100ms")),
            (t(s(10), s(10), s(1)), Some("shorter than the TTL")),
            (t(s(10), s(20), s(1)), Some("shorter than the TTL")),
            (t(s(10), s(5), s(5)), Some("safety margin")),
        ];
        for (timing, expected) in table {
            let got = timing.validate(DEFAULT_DRIFT_FACTOR);
            match (got, expected) {
                (Ok(()), None) => {}
                (Err(e), Some(fragment)) => {
                    assert!(e.to_string().contains(fragment), "{timing:?}: {e}")
                }
                (got, expected) => panic!("{timing:?}: got {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn node_lists_split_on_commas() {
        assert_eq!(
            split_node_list(" redis://a:1, redis://b:2 ,,"),
            vec!["redis://a:1", "redis://b:2"]
        );
    }
}
