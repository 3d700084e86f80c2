//! A TCP proxy that injects network faults between lock clients and a server, since `tc
//! netem` is not available everywhere: added latency, a blackhole (nothing passes, nothing
//! is refused: a partition) and connection resets.
//!
//! One proxy can front several servers (one listening port per upstream) under one fault
//! switch, so a fault hits every node of a Redlock set at once.
//!
//! ```no_run
//! use std::time::Duration;
//! use dlock_testkit::fault_proxy::{FaultProxy, NetFault};
//!
//! # fn demo(server: std::net::SocketAddr) -> std::io::Result<()> {
//! let proxy = FaultProxy::start(&[server])?;
//! let url = format!("redis://{}", proxy.addrs()[0]);
//! proxy.set(NetFault::Latency(Duration::from_millis(200)));
//! proxy.set(NetFault::Blackhole);
//! proxy.set(NetFault::None);
//! proxy.reset_connections(); // RST to every open connection
//! proxy.lose_reply_to("jobs/nightly"); // the server acts on that request; its reply is lost
//! # let _ = url; Ok(()) }
//! ```

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The fault a [`FaultProxy`] applies to the traffic it relays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NetFault {
    /// Bytes pass as they come.
    #[default]
    None,
    /// Every chunk waits this long before it is passed on (both directions).
    Latency(Duration),
    /// Nothing passes and nothing is refused: new connections are accepted but not connected
    /// on, and bytes in flight are held (as TCP would retransmit them) until the fault ends.
    Blackhole,
}

/// A fault-injecting TCP proxy on loopback, on a thread of its own; stopped on drop.
#[derive(Debug)]
pub struct FaultProxy {
    addrs: Vec<SocketAddr>,
    upstreams: Upstreams,
    fault: watch::Sender<NetFault>,
    resets: watch::Sender<u64>,
    replies: Arc<ReplyLoss>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Listens on a free loopback port per upstream and relays to it.
    ///
    /// # Errors
    ///
    /// The runtime or a listener could not be made.
    pub fn start(upstreams: &[SocketAddr]) -> io::Result<FaultProxy> {
        // Bound here, with std, so `start` also works from inside a runtime.
        let mut listeners = Vec::new();
        for index in 0..upstreams.len() {
            let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
            listener.set_nonblocking(true)?;
            listeners.push((listener, index));
        }
        let upstreams: Upstreams = Arc::new(Mutex::new(upstreams.to_vec()));
        let upstreams_in_thread = upstreams.clone();
        let addrs = listeners
            .iter()
            .map(|(listener, _)| listener.local_addr())
            .collect::<io::Result<Vec<_>>>()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (fault, _) = watch::channel(NetFault::None);
        let (resets, _) = watch::channel(0u64);
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let (fault_rx, resets_rx) = (fault.subscribe(), resets.subscribe());
        let replies = Arc::new(ReplyLoss::default());
        let replies_in_thread = replies.clone();
        let thread = std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || {
                runtime.block_on(async move {
                    for (listener, index) in listeners {
                        let Ok(listener) = TcpListener::from_std(listener) else {
                            continue;
                        };
                        tokio::spawn(accept(
                            listener,
                            (upstreams_in_thread.clone(), index),
                            fault_rx.clone(),
                            resets_rx.clone(),
                            replies_in_thread.clone(),
                        ));
                    }
                    let _ = shutdown_rx.await;
                });
            })?;
        Ok(FaultProxy {
            addrs,
            upstreams,
            fault,
            resets,
            replies,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The proxy's addresses, one per upstream, in the same order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Sends new connections to the `index`th upstream to `upstream` instead (open ones stay
    /// where they are: [`reset_connections`](Self::reset_connections) ends them), as a virtual
    /// address moved to a promoted replica does.
    ///
    /// # Panics
    ///
    /// `index` is not below the number of upstreams the proxy was started with.
    pub fn redirect(&self, index: usize, upstream: SocketAddr) {
        self.upstreams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[index] = upstream;
    }

    /// Applies `fault` from now on, to open connections and new ones.
    pub fn set(&self, fault: NetFault) {
        self.fault.send_replace(fault);
    }

    /// Resets every open connection (RST to both sides, as a dropped NAT entry or a crashed
    /// middlebox would); new connections go through.
    pub fn reset_connections(&self) {
        self.resets.send_modify(|generation| *generation += 1);
    }

    /// Loses the reply to the next request that contains `pattern` (a lock's name, say): the
    /// request reaches the server, which acts on it, but the answer is dropped and that
    /// connection reset, as when a crashed middlebox loses a reply. Only one reply is lost.
    pub fn lose_reply_to(&self, pattern: impl Into<Vec<u8>>) {
        *self
            .replies
            .pattern
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(pattern.into());
    }

    /// How many replies [`lose_reply_to`](Self::lose_reply_to) has dropped so far.
    pub fn replies_lost(&self) -> u64 {
        self.replies.lost.load(Ordering::SeqCst)
    }
}

/// Where each listening port relays to; changed by [`FaultProxy::redirect`].
type Upstreams = Arc<Mutex<Vec<SocketAddr>>>;

/// The one-shot switch of [`FaultProxy::lose_reply_to`], shared by every relay.
#[derive(Debug, Default)]
struct ReplyLoss {
    pattern: Mutex<Option<Vec<u8>>>,
    lost: AtomicU64,
}

impl ReplyLoss {
    /// Whether a request chunk is the one whose reply is to be lost (disarms the switch).
    fn matches(&self, request: &[u8]) -> bool {
        let mut pattern = self.pattern.lock().unwrap_or_else(PoisonError::into_inner);
        let found = pattern
            .as_deref()
            .is_some_and(|p| request.windows(p.len().max(1)).any(|w| w == p));
        if found {
            *pattern = None;
        }
        found
    }
}

/// What one relayed connection's two directions share: its request asked for its reply to
/// be lost.
#[derive(Clone, Copy)]
enum Direction<'a> {
    Requests(&'a ReplyLoss, &'a AtomicBool),
    Replies(&'a ReplyLoss, &'a AtomicBool),
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept(
    listener: TcpListener,
    (upstreams, index): (Upstreams, usize),
    fault: watch::Receiver<NetFault>,
    resets: watch::Receiver<u64>,
    replies: Arc<ReplyLoss>,
) {
    loop {
        if let Ok((client, _)) = listener.accept().await {
            let mut resets = resets.clone();
            resets.mark_unchanged();
            let upstream = upstreams.lock().unwrap_or_else(PoisonError::into_inner)[index];
            tokio::spawn(relay(
                client,
                upstream,
                fault.clone(),
                resets,
                replies.clone(),
            ));
        }
    }
}

async fn relay(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut fault: watch::Receiver<NetFault>,
    mut resets: watch::Receiver<u64>,
    replies: Arc<ReplyLoss>,
) {
    let _ = client.set_nodelay(true);
    // A blackholed connect: accepted here, but the server hears nothing until it ends.
    while *fault.borrow_and_update() == NetFault::Blackhole {
        tokio::select! {
            changed = fault.changed() => if changed.is_err() { return },
            _ = resets.changed() => return reset(&client),
        }
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return reset(&client);
    };
    let _ = server.set_nodelay(true);
    let lose_next = AtomicBool::new(false);
    let reset_both = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let requests = Direction::Requests(&replies, &lose_next);
        let answers = Direction::Replies(&replies, &lose_next);
        tokio::select! {
            _ = pump(client_read, server_write, fault.clone(), requests) => false,
            lost = pump(server_read, client_write, fault.clone(), answers) => {
                lost.is_err_and(|e| e.kind() == io::ErrorKind::ConnectionAborted)
            }
            _ = resets.changed() => true,
        }
    };
    if reset_both {
        reset(&server);
        reset(&client);
    }
}

/// Closing with a zero linger sends RST instead of FIN.
fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

async fn pump(
    mut from: tokio::net::tcp::ReadHalf<'_>,
    mut to: tokio::net::tcp::WriteHalf<'_>,
    mut fault: watch::Receiver<NetFault>,
    direction: Direction<'_>,
) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        match direction {
            Direction::Requests(replies, lose_next) if replies.matches(&buf[..n]) => {
                lose_next.store(true, Ordering::SeqCst);
            }
            Direction::Replies(replies, lose_next) if lose_next.load(Ordering::SeqCst) => {
                replies.lost.fetch_add(1, Ordering::SeqCst);
                // Dropped here; the caller resets the connection.
                return Err(io::ErrorKind::ConnectionAborted.into());
            }
            _ => {}
        }
        loop {
            let current = *fault.borrow_and_update();
            match current {
                NetFault::None => break,
                NetFault::Latency(delay) => {
                    tokio::time::sleep(delay).await;
                    break;
                }
                NetFault::Blackhole => {
                    if fault.changed().await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
        to.write_all(&buf[..n]).await?;
    }
}
