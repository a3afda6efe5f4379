//! The fenced store the soak's runs write to: a register per lock that takes a write whose
//! token is at least the largest it took, and refuses it otherwise (the fenced-store model of
//! docs/design.md, "The lab's two checkers"). It listens on the host's end of each cluster's node link; a run sends one line,
//! `LOCK TOKEN WRITER`, and reads `accepted` or `refused`. Every answer is logged with the
//! instants the request was read and answered: the history the checkers judge.

use serde::Serialize;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// One write, as the store answered it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreWrite {
    pub lock: String,
    /// The writing pod.
    pub writer: String,
    pub token: u64,
    pub accepted: bool,
    pub call_us: u64,
    pub return_us: u64,
}

#[derive(Default)]
struct State {
    /// Off: every write is taken (the broken build the checkers must catch).
    fenced: bool,
    largest: HashMap<String, u64>,
    log: Vec<StoreWrite>,
}

/// The store's listeners; they stop when it is dropped.
pub struct FencedStore {
    state: Arc<Mutex<State>>,
    addrs: Vec<SocketAddr>,
    _listeners: JoinSet<()>,
}

pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl FencedStore {
    /// Listens on a free port of each address; `fenced` false takes every write.
    pub async fn start(on: &[IpAddr], fenced: bool) -> std::io::Result<Self> {
        let state = Arc::new(Mutex::new(State {
            fenced,
            ..State::default()
        }));
        let mut listeners = JoinSet::new();
        let mut addrs = Vec::new();
        for ip in on {
            let listener = TcpListener::bind((*ip, 0)).await?;
            addrs.push(listener.local_addr()?);
            let state = state.clone();
            listeners.spawn(async move {
                let mut connections = JoinSet::new();
                while let Ok((stream, _)) = listener.accept().await {
                    connections.spawn(serve(stream, state.clone()));
                    while connections.try_join_next().is_some() {}
                }
            });
        }
        Ok(Self {
            state,
            addrs,
            _listeners: listeners,
        })
    }

    /// Where the store listens, in the order of the addresses given to `start`.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Every answer so far, in the order given.
    pub fn log(&self) -> Vec<StoreWrite> {
        self.state.lock().map(|s| s.log.clone()).unwrap_or_default()
    }
}

async fn serve(stream: TcpStream, state: Arc<Mutex<State>>) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    if BufReader::new(read).read_line(&mut line).await.is_err() {
        return;
    }
    let Some((lock, token, writer)) = parse(&line) else {
        let _ = write
            .write_all(b"error: expected `LOCK TOKEN WRITER`\n")
            .await;
        return;
    };
    let call_us = now_us();
    let (accepted, index) = {
        let Ok(mut state) = state.lock() else { return };
        let accepted = decide(&mut state.largest, lock, token) || !state.fenced;
        state.log.push(StoreWrite {
            lock: lock.to_string(),
            writer: writer.to_string(),
            token,
            accepted,
            call_us,
            return_us: call_us,
        });
        (accepted, state.log.len() - 1)
    };
    let answer: &[u8] = if accepted {
        b"accepted\n"
    } else {
        b"refused\n"
    };
    // The write took effect whether or not the answer reaches the run (its pod may be gone):
    // the answer's instant closes the interval either way.
    let _ = write.write_all(answer).await;
    if let Ok(mut state) = state.lock() {
        state.log[index].return_us = now_us();
    }
}

fn parse(line: &str) -> Option<(&str, u64, &str)> {
    let mut fields = line.split_whitespace();
    let lock = fields.next()?;
    let token = fields.next()?.parse().ok()?;
    let writer = fields.next()?;
    fields.next().is_none().then_some((lock, token, writer))
}

/// The fence: a token at least the largest taken is taken (a run writes more than once under
/// its token), a smaller one is refused.
fn decide(largest: &mut HashMap<String, u64>, lock: &str, token: u64) -> bool {
    let taken = largest.entry(lock.to_string()).or_insert(0);
    if token >= *taken {
        *taken = token;
        true
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn send(addr: SocketAddr, line: &str) -> String {
        let mut stream = TcpStream::connect(addr)
            .await
            .expect("connect to the store");
        stream.write_all(line.as_bytes()).await.expect("send");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.expect("read");
        answer
    }

    #[tokio::test]
    async fn the_store_takes_growing_tokens_per_lock_and_refuses_stale_ones() {
        let store = FencedStore::start(&[IpAddr::from([127, 0, 0, 1])], true)
            .await
            .expect("start the store");
        let addr = store.addrs()[0];
        let mut answers = Vec::new();
        for line in [
            "a 5 pod-1\n",
            "a 5 pod-1\n",
            "a 4 pod-2\n",
            "b 1 pod-3\n",
            "a 6 pod-4\n",
            "a nonsense\n",
        ] {
            answers.push(send(addr, line).await);
        }
        assert_eq!(
            answers,
            [
                "accepted\n",
                "accepted\n",
                "refused\n",
                "accepted\n",
                "accepted\n",
                "error: expected `LOCK TOKEN WRITER`\n"
            ]
        );
        let log = store.log();
        let seen: Vec<(&str, u64, bool)> = log
            .iter()
            .map(|w| (w.lock.as_str(), w.token, w.accepted))
            .collect();
        assert_eq!(
            seen,
            [
                ("a", 5, true),
                ("a", 5, true),
                ("a", 4, false),
                ("b", 1, true),
                ("a", 6, true)
            ]
        );
        assert!(log.iter().all(|w| w.call_us <= w.return_us));
    }

    /// The broken build: a stale token is taken all the same, and logged as taken.
    #[tokio::test]
    async fn an_unfenced_store_takes_stale_tokens_too() {
        let store = FencedStore::start(&[IpAddr::from([127, 0, 0, 1])], false)
            .await
            .expect("start the store");
        let addr = store.addrs()[0];
        assert_eq!(send(addr, "a 5 pod-1\n").await, "accepted\n");
        assert_eq!(send(addr, "a 4 pod-2\n").await, "accepted\n");
        let tokens: Vec<(u64, bool)> = store.log().iter().map(|w| (w.token, w.accepted)).collect();
        assert_eq!(tokens, [(5, true), (4, true)]);
    }
}
