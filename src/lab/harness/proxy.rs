//! A fault-injecting TCP proxy on loopback, put between the engine and one Redis node.
//! Runs on its own thread and runtime, so sync and async callers can use it alike.

use super::error::HarnessError;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Bytes flow as they come.
    Forward,
    /// Every chunk waits this long in each direction (so a round trip gains twice this).
    Delay(Duration),
    /// Nothing flows, connections stay open: a partition. Data is held, not dropped, and flows
    /// again when the mode changes, as TCP would deliver after the network heals.
    Blackhole,
    /// Open connections are closed and new ones are closed at once: a node that resets.
    Reject,
}

pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    /// Bumped to close every open connection.
    cut: watch::Sender<u64>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port that forwards to `target` (a `host:port`).
    pub fn start(target: &str) -> Result<Self, HarnessError> {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST.into(), target)
    }

    /// Starts a proxy on a free port of `listen` (an address of this host, e.g. the host's end
    /// of a test network's link, so that pods reach a loopback node) that forwards to `target`.
    pub fn start_on(listen: std::net::IpAddr, target: &str) -> Result<Self, HarnessError> {
        let target: SocketAddr = target.parse().map_err(|_| {
            HarnessError::Io(
                "parse the proxy target",
                std::io::Error::new(std::io::ErrorKind::InvalidInput, target.to_string()),
            )
        })?;
        let listener = std::net::TcpListener::bind((listen, 0))
            .map_err(|e| HarnessError::Io("bind the proxy", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| HarnessError::Io("read the proxy address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| HarnessError::Io("configure the proxy socket", e))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| HarnessError::Io("start the proxy runtime", e))?;
        let (mode, mode_rx) = watch::channel(ProxyMode::Forward);
        let (cut, cut_rx) = watch::channel(0u64);
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = TcpListener::from_std(listener) else {
                    return;
                };
                let accept = accept_loop(listener, target, mode_rx, cut_rx);
                tokio::select! {
                    _ = accept => {}
                    _ = shutdown_rx => {}
                }
            });
        });
        Ok(Self {
            addr,
            mode,
            cut,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The `host:port` clients connect to.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
        if mode == ProxyMode::Reject {
            self.cut_connections();
        }
    }

    /// Closes every open connection; new ones are accepted as the mode says.
    pub fn cut_connections(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    mode: watch::Receiver<ProxyMode>,
    cut: watch::Receiver<u64>,
) {
    while let Ok((client, _)) = listener.accept().await {
        if *mode.borrow() == ProxyMode::Reject {
            drop(client);
            continue;
        }
        let (mode, mut cut) = (mode.clone(), cut.clone());
        tokio::spawn(async move {
            cut.mark_unchanged();
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let upstream = pump(client_read, server_write, mode.clone());
            let downstream = pump(server_read, client_write, mode);
            tokio::select! {
                _ = async { tokio::join!(upstream, downstream) } => {}
                _ = cut.changed() => {} // dropping both halves closes both sockets
            }
        });
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<ProxyMode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // While blackholed, read nothing: the kernel buffers fill and the peer stalls.
        while *mode.borrow_and_update() == ProxyMode::Blackhole {
            if mode.changed().await.is_err() {
                return;
            }
        }
        let n = match from.read(&mut buf[..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            let current = *mode.borrow_and_update();
            match current {
                ProxyMode::Forward => break,
                ProxyMode::Delay(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                ProxyMode::Blackhole => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
                ProxyMode::Reject => return,
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
