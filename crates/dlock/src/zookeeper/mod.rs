#![doc = include_str!("docs.md")]

mod config;
mod error;
mod values;

pub use config::{Acl, ZookeeperConfig};

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tokio::sync::{Mutex, Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Acls, Client, CreateMode, EventType, SessionState, WatchedEvent};

use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Lease, ListPage, LockInfo, LockKind,
    MonitorStore, ValueStore, Wait,
};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};

use error::{BACKEND, map, session_lost, suspended};

/// URL schemes served by this backend.
pub const ZOOKEEPER_SCHEMES: &[&str] = &["zk", "zookeeper"];

const INFO: BackendInfo = BackendInfo::new(
    BACKEND,
    Capabilities {
        reentrant: false,
        // The queue of sequential nodes is FIFO by construction.
        fair: true,
        native_wait: true,
        native_loss_signal: true,
        cross_process: true,
        monitor: true,
        values: true,
        permits: true,
        rwlock: true,
    },
);

/// Children of a lock's directory: `_c_<tag>-lock-<sequence>`, the tag (a fresh UUID per
/// acquire call) being what finds a node whose create reply was lost (Curator's protected mode).
const NODE_PREFIX: &str = "_c_";
const NODE_INFIX: &str = "-lock-";

/// First and largest pause before retrying an acquire whose store call failed.
const RETRY_MIN: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_millis(500);

/// Builds a [`ZookeeperBackend`] from options.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// use dlock::zookeeper::ZookeeperBuilder;
/// let backend = ZookeeperBuilder::new("zk://zk1:2181,zk2:2181,zk3:2181/billing")?
///     .session_timeout(Duration::from_secs(6))
///     .build()
///     .await?;
/// let locks = dlock::Locks::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct ZookeeperBuilder {
    config: ZookeeperConfig,
}

impl ZookeeperBuilder {
    /// A builder for the ensemble of a `zk://` URL (options in the URL are read too; see
    /// [`ZookeeperConfig::from_url`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] as for [`ZookeeperConfig::from_url`].
    pub fn new(url: &str) -> Result<ZookeeperBuilder> {
        Ok(ZookeeperBuilder {
            config: ZookeeperConfig::from_url(url)?,
        })
    }

    /// A builder from a full config.
    pub fn from_config(config: ZookeeperConfig) -> ZookeeperBuilder {
        ZookeeperBuilder { config }
    }

    /// See [`ZookeeperConfig::chroot`].
    pub fn chroot(mut self, chroot: impl Into<String>) -> Self {
        self.config.chroot = chroot.into();
        self
    }

    /// See [`ZookeeperConfig::session_timeout`].
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.config.session_timeout = timeout;
        self
    }

    /// See [`ZookeeperConfig::connect_timeout`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// Digest credentials (see [`ZookeeperConfig::digest`]); also makes the nodes
    /// creator-only ([`Acl::Creator`]).
    pub fn digest(mut self, user: &str, password: &str) -> Self {
        self.config.digest = Some(format!("{user}:{password}"));
        self.config.acl = Acl::Creator;
        self
    }

    /// See [`ZookeeperConfig::acl`].
    pub fn acl(mut self, acl: Acl) -> Self {
        self.config.acl = acl;
        self
    }

    /// Opens a session and checks that the lock directory can be read.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`]: a bad option;
    /// - [`Error::Unavailable`]: no server answered within the connect timeout;
    /// - [`Error::PermissionDenied`]: the credentials may not read the lock directory.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call only drops its session.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let backend = dlock::zookeeper::ZookeeperBuilder::new("zk://127.0.0.1:2181")?.build().await?;
    /// # Ok(()) }
    /// ```
    pub async fn build(self) -> Result<ZookeeperBackend> {
        let config = self.config;
        config.validate()?;
        let session = Session::connect(&config).await?;
        // Credentials are only checked against ACLs: fail here, not on the first lock.
        match session.client.check_stat(&config.chroot).await {
            Ok(_) => {}
            Err(e) => return Err(map(e, &config.chroot)),
        }
        Ok(ZookeeperBackend {
            inner: Arc::new(Inner {
                config,
                session: Mutex::new(session),
            }),
        })
    }
}

/// Locks in ZooKeeper: an ephemeral sequential node per holder or waiter under a directory
/// per lock, each waiter watching only its predecessor, fences from the node's `czxid`.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("zk://127.0.0.1:2181/app?session_timeout=6s").await?;
/// let guard = locks.mutex("nightly-report").acquire().await?;
/// println!("fence {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ZookeeperBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: ZookeeperConfig,
    /// The current session; replaced by a new one once it is lost.
    session: Mutex<Arc<Session>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZookeeperBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ZookeeperBackend {
    /// Connects to the ensemble of a `zk://` URL; see [`ZookeeperConfig::from_url`].
    ///
    /// # Errors
    ///
    /// As [`ZookeeperConfig::from_url`] and [`ZookeeperBuilder::build`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let backend = dlock::zookeeper::ZookeeperBackend::connect_url("zk://127.0.0.1:2181").await?;
    /// let locks = dlock::Locks::new(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect_url(url: &str) -> Result<ZookeeperBackend> {
        ZookeeperBuilder::new(url)?.build().await
    }

    /// The options this client runs with.
    pub fn config(&self) -> &ZookeeperConfig {
        &self.inner.config
    }

    /// The id and password of the client's current session, for operators and fault tests
    /// (another connection that resumes and closes it ends every lock this client holds).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let backend = dlock::zookeeper::ZookeeperBackend::connect_url("zk://127.0.0.1:2181").await?;
    /// println!("session {}", backend.session().await.id());
    /// # Ok(()) }
    /// ```
    pub async fn session(&self) -> zookeeper_client::SessionInfo {
        self.inner.session.lock().await.client.session().clone()
    }
}

impl Inner {
    /// The current session, or a new one if it was lost.
    async fn session(&self) -> Result<Arc<Session>> {
        let mut current = self.session.lock().await;
        if current.gone.is_cancelled() {
            *current = Session::connect(&self.config).await?;
        }
        Ok(current.clone())
    }

    fn dir(&self, name: &str) -> String {
        format!("{}/{}", self.config.chroot, encode_name(name))
    }

    fn acls(&self) -> Acls<'static> {
        match self.config.acl {
            Acl::Open => Acls::anyone_all(),
            Acl::Creator => Acls::creator_all(),
        }
    }
}

/// One ZooKeeper session and what is known about its state.
struct Session {
    client: Client,
    id: i64,
    /// Cancelled when the session is over: expired, closed, or suspended for so long that the
    /// server may have expired it. Every lock held in it is then lost.
    gone: CancellationToken,
    /// Whether the connection is up (false while suspended).
    connected: watch::Receiver<bool>,
}

impl Session {
    async fn connect(config: &ZookeeperConfig) -> Result<Arc<Session>> {
        let mut connector = Client::connector().with_session_timeout(config.session_timeout);
        if let Some(digest) = &config.digest {
            connector = connector.with_auth("digest", digest.as_bytes());
        }
        let client =
            tokio::time::timeout(config.connect_timeout, connector.connect(&config.servers))
                .await
                .map_err(|_| Error::Unavailable {
                    backend: BACKEND,
                    source: format!(
                        "no ZooKeeper server of {} answered within {:?}",
                        config.servers, config.connect_timeout
                    )
                    .into(),
                })?
                .map_err(|e| map(e, &config.servers))?;
        let gone = CancellationToken::new();
        let (connected_tx, connected) = watch::channel(true);
        // The server expires a session `timeout` after it last heard from the client; the
        // client notices a silent connection after 2/5 of it (the client library's default).
        // Half the timeout after the suspension began is therefore still inside the session,
        // with a margin: past that, the locks are reported lost, as the server may have
        // expired them.
        let budget = client.session_timeout() / 2;
        let mut states = client.state_watcher();
        let watch_gone = gone.clone();
        tokio::spawn(async move {
            let mut suspended_since: Option<Instant> = None;
            loop {
                let give_up = suspended_since.map(|at| at + budget);
                tokio::select! {
                    state = states.changed() => match state {
                        SessionState::Disconnected => {
                            suspended_since.get_or_insert_with(Instant::now);
                            let _ = connected_tx.send(false);
                        }
                        SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                            suspended_since = None;
                            let _ = connected_tx.send(true);
                        }
                        SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                            tracing::debug!(?state, "ZooKeeper session over");
                            watch_gone.cancel();
                            return;
                        }
                    },
                    () = sleep_until_opt(give_up) => {
                        tracing::debug!(?budget, "ZooKeeper connection suspended past the session's safe window");
                        watch_gone.cancel();
                        return;
                    }
                    () = watch_gone.cancelled() => return,
                }
            }
        });
        Ok(Arc::new(Session {
            id: client.session_id().0,
            client,
            gone,
            connected,
        }))
    }

    /// `Ok` while the session is alive and connected; the state is uncertain while suspended.
    fn check(&self) -> Result<()> {
        if self.gone.is_cancelled() {
            return Err(session_lost());
        }
        if !*self.connected.borrow() {
            return Err(suspended());
        }
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Stops the state task; the client closes the session when its last handle drops.
        self.gone.cancel();
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A lock name as one ZooKeeper node name: bytes outside `[A-Za-z0-9._~-]` as `%XX`, so
/// slashes, spaces and characters ZooKeeper refuses in paths (emoji, controls) all fit, and
/// names differing in case stay distinct.
fn encode_name(name: &str) -> String {
    let all_dots = name.bytes().all(|b| b == b'.');
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~') || (b == b'.' && !all_dots)
        {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode_name(node: &str) -> Option<String> {
    let bytes = node.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(node.get(i + 1..i + 3)?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The sequence number of a dlock node name, `None` for anything else.
fn sequence(child: &str) -> Option<i64> {
    if !child.starts_with(NODE_PREFIX) {
        return None;
    }
    let (_, seq) = child.rsplit_once(NODE_INFIX)?;
    seq.parse().ok()
}

/// The dlock nodes of a directory in queue order.
fn queue(children: Vec<String>) -> Vec<(i64, String)> {
    let mut queue: Vec<(i64, String)> = children
        .into_iter()
        .filter_map(|c| sequence(&c).map(|s| (s, c)))
        .collect();
    queue.sort_unstable();
    queue
}

/// What an acquire call waits for in its directory's queue: the rule of the lock's kind.
#[derive(Clone, Copy, Debug)]
enum Turn {
    /// A mutex, or the write side of a read-write lock: first in line.
    Exclusive,
    /// A reader: no writer ahead (so a waiting writer holds back later readers), and fewer
    /// than `max_readers` readers ahead.
    Read { max_readers: u32 },
    /// A writer of a read-write lock: first in line.
    Write,
    /// A permit: among the first `permits` in line.
    Permit { permits: u32 },
}

/// What to do after looking at the queue.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Granted,
    /// Wait for the node at this index to go.
    WatchNode(usize),
    /// Wait for any change of the directory.
    WatchChildren,
    /// A semaphore's earlier node asks for another number of permits.
    SizeMismatch {
        asked: u32,
        held_with: u32,
    },
}

impl Turn {
    fn of(kind: LockKind) -> Turn {
        match kind {
            LockKind::Read { max_readers } => Turn::Read { max_readers },
            LockKind::Write => Turn::Write,
            LockKind::Permit { permits } => Turn::Permit { permits },
            _ => Turn::Exclusive,
        }
    }

    /// The first letter of a node's tag. Mutex tags are hex, so never `r`, `w` or `p`.
    fn tag_letter(self) -> &'static str {
        match self {
            Turn::Exclusive => "",
            Turn::Read { .. } => "r",
            Turn::Write => "w",
            Turn::Permit { .. } => "p",
        }
    }

    /// The directory of the lock: read-write locks and semaphores live beside the mutexes of
    /// the same name (a NUL, never part of a lock name, keeps them apart).
    fn dir_name(self, name: &str) -> String {
        match self {
            Turn::Exclusive => name.to_owned(),
            Turn::Read { .. } | Turn::Write => format!("{name}\0rw"),
            Turn::Permit { .. } => format!("{name}\0sem"),
        }
    }

    fn decide(self, queue: &[(i64, String)], position: usize) -> Decision {
        let limit = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        match self {
            Turn::Exclusive | Turn::Write if position == 0 => Decision::Granted,
            Turn::Exclusive | Turn::Write => Decision::WatchNode(position - 1),
            Turn::Read { max_readers } => {
                let writer = queue[..position]
                    .iter()
                    .rposition(|(_, child)| is_writer(child));
                match writer {
                    Some(index) => Decision::WatchNode(index),
                    None if position < limit(max_readers) => Decision::Granted,
                    None => Decision::WatchChildren,
                }
            }
            Turn::Permit { permits } => {
                // Of two calls with different sizes the later sees the earlier's node.
                let other = queue[..position]
                    .iter()
                    .find_map(|(_, child)| permit_size(child).filter(|&size| size != permits));
                match other {
                    Some(held_with) => Decision::SizeMismatch {
                        asked: permits,
                        held_with,
                    },
                    None if position < limit(permits) => Decision::Granted,
                    None => Decision::WatchChildren,
                }
            }
        }
    }

    /// A fresh tag for one acquire call: the kind's letter, a unique id, and for a permit
    /// its semaphore's size (`p<uuid>n<permits>`), so every call can check the others'.
    fn new_tag(self) -> String {
        let id = uuid::Uuid::new_v4().simple();
        match self {
            Turn::Permit { permits } => format!("p{id}n{permits}"),
            _ => format!("{}{id}", self.tag_letter()),
        }
    }
}

/// The semaphore size a permit's node carries, if it is a permit node that says.
fn permit_size(child: &str) -> Option<u32> {
    let tag = child.strip_prefix(NODE_PREFIX)?.split(NODE_INFIX).next()?;
    let (_, size) = tag.strip_prefix('p')?.split_once('n')?;
    size.parse().ok()
}

/// Whether a queue node is a read-write lock's writer.
fn is_writer(child: &str) -> bool {
    child
        .strip_prefix(NODE_PREFIX)
        .is_some_and(|tag| tag.starts_with('w'))
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What a lock node holds, for inspection: when, until when (the holder's clock), who.
fn node_data(owner: &Owner, acquired_ms: u64, deadline_ms: u64) -> Vec<u8> {
    format!(
        "dlock1\0{acquired_ms}\0{deadline_ms}\0{}\0{}\0{}",
        owner.pid,
        owner.host,
        owner.label.as_deref().unwrap_or_default()
    )
    .into_bytes()
}

/// Deletes a node, retrying through a suspended connection until the server has ended the
/// session. A session this client gave up on (suspended past the safe window) may come back
/// alive with the node: it is deleted then, so a lock reported lost is never left held.
async fn delete_until_done(session: &Session, path: &str) {
    let mut pause = RETRY_MIN;
    let give_up = Instant::now() + session.client.session_timeout() * 4;
    loop {
        let over = matches!(
            session.client.state(),
            SessionState::Expired | SessionState::Closed | SessionState::AuthFailed
        );
        match session.client.delete(path, None).await {
            Ok(()) | Err(zookeeper_client::Error::NoNode) => return,
            Err(error)
                if map(error.clone(), path).is_retryable() && !over && Instant::now() < give_up =>
            {
                tracing::debug!(%error, path, "deleting a lock node failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
            Err(error) => {
                tracing::debug!(%error, path, "deleting a lock node failed; the session's end removes it");
                return;
            }
        }
    }
}

/// Our node in a lock's queue.
struct Node {
    session: Arc<Session>,
    path: String,
    seq: i64,
    czxid: i64,
}

/// What an acquire call has put in the store; removed if the call ends without the lock
/// (timeout, error or the future dropped).
struct Waiter {
    inner: Arc<Inner>,
    dir: String,
    /// Unique per acquire call; its first letter says the kind of hold (see [`Turn`]).
    tag: String,
    turn: Turn,
    node: Option<Node>,
    /// A create was sent in this session and its reply not read: the node may exist.
    uncertain: Option<Arc<Session>>,
}

impl Waiter {
    fn prefix(&self) -> String {
        format!("{}/{NODE_PREFIX}{}{NODE_INFIX}", self.dir, self.tag)
    }

    /// Protected mode: finds a node of this call's tag whose create reply was lost.
    async fn find_tagged(&self, session: &Arc<Session>) -> Result<Option<Node>> {
        let children = match session.client.list_children(&self.dir).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => return Ok(None),
            Err(e) => return Err(map(e, &self.dir)),
        };
        let mine = format!("{NODE_PREFIX}{}{NODE_INFIX}", self.tag);
        for child in children {
            if let (true, Some(seq)) = (child.starts_with(&mine), sequence(&child)) {
                let path = format!("{}/{child}", self.dir);
                match session.client.check_stat(&path).await {
                    Ok(Some(stat)) if stat.ephemeral_owner == session.id => {
                        return Ok(Some(Node {
                            session: session.clone(),
                            path,
                            seq,
                            czxid: stat.czxid,
                        }));
                    }
                    Ok(_) => {}
                    Err(e) => return Err(map(e, &path)),
                }
            }
        }
        Ok(None)
    }

    /// Removes our node now (a timed-out wait), leaving any failure to `Drop`.
    async fn leave(&mut self) {
        if let Some(node) = &self.node {
            match node.session.client.delete(&node.path, None).await {
                Ok(()) | Err(zookeeper_client::Error::NoNode) => self.node = None,
                Err(error) => {
                    tracing::debug!(%error, path = node.path, "leaving the queue failed; retrying in the background");
                }
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let node = self.node.take();
        let uncertain = self.uncertain.take();
        if node.is_none() && uncertain.is_none() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // ephemeral: the session's end removes the node
        };
        let dir = self.dir.clone();
        let mine = format!("{NODE_PREFIX}{}{NODE_INFIX}", self.tag);
        runtime.spawn(async move {
            if let Some(node) = node {
                delete_until_done(&node.session, &node.path).await;
            }
            if let Some(session) = uncertain {
                // Requests of one session run in order: this listing sees the lost create.
                if let Ok(children) = session.client.list_children(&dir).await {
                    for child in children.iter().filter(|c| c.starts_with(&mine)) {
                        delete_until_done(&session, &format!("{dir}/{child}")).await;
                    }
                }
            }
        });
    }
}

#[async_trait]
impl Backend for ZookeeperBackend {
    fn info(&self) -> &BackendInfo {
        &INFO
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        if req.reentrant {
            return Err(Error::Unsupported {
                operation: "reentrant locks",
                backend: BACKEND,
            });
        }
        let deadline = req.wait.deadline();
        let turn = Turn::of(req.kind);
        let mut waiter = Waiter {
            inner: self.inner.clone(),
            dir: self.inner.dir(&turn.dir_name(req.name.as_str())),
            tag: turn.new_tag(),
            turn,
            node: None,
            uncertain: None,
        };
        let mut pause = RETRY_MIN;
        let mut renewed = false;
        loop {
            match attempt(&mut waiter, req, deadline).await {
                Ok(granted) => return Ok(granted),
                // The session turned out to be over: once, at once, on a new one (even for
                // `no_wait`, whose answer must be about the lock, not about an old session).
                Err(error) if is_session_expired(&error) && !renewed => renewed = true,
                // A waiter rides out a suspended connection or a lost session until its
                // deadline (a new session queues again at the tail).
                Err(error) if error.is_retryable() && req.wait != Wait::No => {
                    let now = Instant::now();
                    if deadline.is_some_and(|at| at <= now) {
                        return Err(error);
                    }
                    tracing::debug!(%error, "ZooKeeper acquire failed; retrying");
                    let mut sleep = pause;
                    if let Some(at) = deadline {
                        sleep = sleep.min(at - now);
                    }
                    tokio::time::sleep(sleep).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
                Err(error) => return Err(error),
            }
        }
    }

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        Some(self)
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        Some(self)
    }
}

/// Completes when a one-shot watch fires or can no longer fire. zookeeper-client 0.11 panics
/// inside `changed()` when its session ends before the watch fires (the event channel is
/// dropped); awaiting it in its own task turns that into an ordinary wake-up, after which the
/// callers check the session's state.
async fn watch_fired(watcher: zookeeper_client::OneshotWatcher) -> Option<WatchedEvent> {
    tokio::spawn(watcher.changed()).await.ok()
}

/// Creates the lock's directory (a container node, which the server deletes once it is
/// empty) and the chroot above it (persistent) as needed.
async fn create_dir(inner: &Inner, session: &Session, dir: &str) -> Result<()> {
    let acls = inner.acls();
    for _ in 0..3 {
        match session
            .client
            .create(dir, &[], &CreateMode::Container.with_acls(acls))
            .await
        {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => return Ok(()),
            Err(zookeeper_client::Error::NoNode) => {
                match session
                    .client
                    .mkdir(
                        &inner.config.chroot,
                        &CreateMode::Persistent.with_acls(acls),
                    )
                    .await
                {
                    Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
                    Err(e) => return Err(map(e, &inner.config.chroot)),
                }
            }
            Err(e) => return Err(map(e, dir)),
        }
    }
    Err(Error::Unavailable {
        backend: BACKEND,
        source: format!("{dir} kept disappearing while being created").into(),
    })
}

/// Whether an error says the session is over (the server told us, before the session's
/// state watcher did).
fn is_session_expired(error: &Error) -> bool {
    matches!(error, Error::Unavailable { source, .. }
        if source.downcast_ref::<zookeeper_client::Error>() == Some(&zookeeper_client::Error::SessionExpired))
}

/// One pass: queue (or find our earlier node), then wait for the predecessors to go.
async fn attempt(
    waiter: &mut Waiter,
    req: &AcquireRequest,
    deadline: Option<Instant>,
) -> Result<Option<Arc<dyn Lease>>> {
    let session = waiter.inner.session().await?;
    let result = attempt_in(waiter, req, deadline, &session).await;
    if let Err(error) = &result
        && is_session_expired(error)
    {
        // The next attempt opens a new session instead of failing on this one again.
        session.gone.cancel();
    }
    result
}

async fn attempt_in(
    waiter: &mut Waiter,
    req: &AcquireRequest,
    deadline: Option<Instant>,
    session: &Arc<Session>,
) -> Result<Option<Arc<dyn Lease>>> {
    let inner = waiter.inner.clone();
    // A node of a session that is over is gone with it.
    if waiter
        .node
        .as_ref()
        .is_some_and(|n| n.session.gone.is_cancelled())
    {
        waiter.node = None;
    }
    if waiter
        .uncertain
        .as_ref()
        .is_some_and(|s| s.gone.is_cancelled())
    {
        waiter.uncertain = None;
    }
    if waiter.node.is_none() && waiter.uncertain.is_some() {
        waiter.node = waiter.find_tagged(session).await?;
        waiter.uncertain = None;
    }
    if waiter.node.is_none() {
        let path = waiter.prefix();
        let ttl_ms = u64::try_from(req.ttl.as_millis()).unwrap_or(u64::MAX);
        let now = unix_ms(SystemTime::now());
        let data = node_data(&req.owner, now, now.saturating_add(ttl_ms));
        let options = CreateMode::EphemeralSequential.with_acls(inner.acls());
        let mut created = None;
        for _ in 0..3 {
            waiter.uncertain = Some(session.clone());
            match session.client.create(&path, &data, &options).await {
                Ok(reply) => {
                    created = Some(reply);
                    break;
                }
                Err(zookeeper_client::Error::NoNode) => {
                    waiter.uncertain = None;
                    create_dir(&inner, session, &waiter.dir).await?;
                }
                Err(e) => {
                    if !map(e.clone(), &path).is_retryable() {
                        waiter.uncertain = None;
                    }
                    return Err(map(e, &waiter.dir));
                }
            }
        }
        waiter.uncertain = None;
        let Some((stat, seq)) = created else {
            return Err(Error::Unavailable {
                backend: BACKEND,
                source: format!("{} kept disappearing", waiter.dir).into(),
            });
        };
        waiter.node = Some(Node {
            session: session.clone(),
            path: format!("{path}{seq}"),
            seq: seq.into_i64(),
            czxid: stat.czxid,
        });
    }
    loop {
        let Some(node) = &waiter.node else {
            return Err(session_lost());
        };
        let checked = Instant::now();
        let children = match session.client.list_children(&waiter.dir).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(e) => return Err(map(e, &waiter.dir)),
        };
        let queue = queue(children);
        let Some(position) = queue.iter().position(|(seq, _)| *seq == node.seq) else {
            // Our node is gone (the session ended, or someone deleted it): queue again.
            waiter.node = None;
            return Err(Error::Unavailable {
                backend: BACKEND,
                source: "the waiter's node disappeared".into(),
            });
        };
        let watched = match waiter.turn.decide(&queue, position) {
            Decision::SizeMismatch { asked, held_with } => {
                waiter.leave().await;
                return Err(Error::SizeMismatch {
                    name: req.name.to_string(),
                    asked,
                    held_with,
                });
            }
            Decision::Granted => {
                let Some(node) = waiter.node.take() else {
                    return Err(session_lost());
                };
                return Ok(Some(ZkLease::start(node, req, checked)));
            }
            Decision::WatchNode(_) | Decision::WatchChildren
                if deadline.is_some_and(|at| at <= Instant::now()) =>
            {
                waiter.leave().await;
                return Ok(None);
            }
            // Watch only the node that must go: its end wakes one waiter, not the herd. If
            // that node was a waiter that gave up, the next listing finds the next one.
            Decision::WatchNode(index) => {
                let ahead = format!("{}/{}", waiter.dir, queue[index].1);
                let (stat, watcher) = session
                    .client
                    .check_and_watch_stat(&ahead)
                    .await
                    .map_err(|e| map(e, &ahead))?;
                if stat.is_none() {
                    continue;
                }
                watcher
            }
            // Any node ahead leaving may be our turn (a permit or a reader place came free).
            Decision::WatchChildren => {
                let (children, watcher) = session
                    .client
                    .list_and_watch_children(&waiter.dir)
                    .await
                    .map_err(|e| map(e, &waiter.dir))?;
                if self::queue(children) != queue {
                    continue; // changed since the listing we decided on
                }
                watcher
            }
        };
        tokio::select! {
            _ = watch_fired(watched) => {}
            () = sleep_until_opt(deadline) => {
                waiter.leave().await;
                return Ok(None);
            }
            () = session.gone.cancelled() => return Err(session_lost()),
        }
    }
}

/// Deadline and release state of one hold, shared with its keeper task.
struct HoldState {
    /// When this client deletes the node if it is not extended (the TTL, kept by the client:
    /// ZooKeeper has no expiring ephemeral nodes).
    deadline: Instant,
    /// Released, expired or lost: no further extend or release.
    over: bool,
}

struct LeaseShared {
    name: String,
    session: Arc<Session>,
    path: String,
    fence: u64,
    owner: Owner,
    acquired_ms: u64,
    lost: CancellationToken,
    start: Instant,
    state: StdMutex<HoldState>,
    changed: Notify,
}

/// One hold of a ZooKeeper lock.
struct ZkLease {
    shared: Arc<LeaseShared>,
}

impl std::fmt::Debug for ZkLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkLease")
            .field("path", &self.shared.path)
            .field("fence", &self.shared.fence)
            .finish_non_exhaustive()
    }
}

impl LeaseShared {
    fn state(&self) -> std::sync::MutexGuard<'_, HoldState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ZkLease {
    fn start(node: Node, req: &AcquireRequest, start: Instant) -> Arc<dyn Lease> {
        let shared = Arc::new(LeaseShared {
            name: req.name.as_str().to_owned(),
            session: node.session,
            path: node.path,
            // czxid: the zxid that created the node, greater than that of every node created
            // before it, in this directory or any earlier incarnation of it.
            fence: u64::try_from(node.czxid).unwrap_or(0),
            owner: req.owner.clone(),
            acquired_ms: unix_ms(SystemTime::now()),
            lost: CancellationToken::new(),
            start,
            state: StdMutex::new(HoldState {
                deadline: start + req.ttl,
                over: false,
            }),
            changed: Notify::new(),
        });
        tokio::spawn(keep(shared.clone()));
        Arc::new(ZkLease { shared })
    }
}

type EventFuture = Pin<Box<dyn Future<Output = Option<WatchedEvent>> + Send>>;

/// How long a hold lasts before its keeper watches the hold's own node (see `keep`).
const OWN_NODE_WATCH_DELAY: Duration = Duration::from_millis(50);

/// Watches one hold: deletes the node when its TTL runs out, and fires the lost signal when
/// the node is deleted by someone else (a force-release) or the session ends.
async fn keep(shared: Arc<LeaseShared>) {
    let session = shared.session.clone();
    let mut watch: Option<EventFuture> = None;
    let mut armed = false;
    // Most holds are short: arm the watch on our own node only once the hold has lasted a
    // moment, so a quick acquire + release costs the server two requests, not three. Until
    // then a force-release is noticed by the next extend; the TTL and session still apply.
    let arm_at = shared.start + OWN_NODE_WATCH_DELAY;
    loop {
        let (over, deadline) = {
            let state = shared.state();
            (state.over, state.deadline)
        };
        if over {
            break;
        }
        if !armed && Instant::now() < arm_at && deadline > arm_at {
            tokio::select! {
                () = tokio::time::sleep_until(arm_at) => {}
                () = shared.changed.notified() => {}
                () = session.gone.cancelled() => {}
            }
            if !session.gone.is_cancelled() {
                continue;
            }
        }
        if !armed {
            armed = true;
            match session.client.check_and_watch_stat(&shared.path).await {
                Ok((Some(_), watcher)) => watch = Some(Box::pin(watch_fired(watcher))),
                Ok((None, _)) => {
                    if !shared.state().over {
                        shared.lost.cancel();
                    }
                    break;
                }
                // Connection trouble: the session's state decides, below.
                Err(_) => watch = None,
            }
        }
        let deadline = {
            let state = shared.state();
            if state.over {
                break;
            }
            state.deadline
        };
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {
                let expired = {
                    let mut state = shared.state();
                    let expired = !state.over && state.deadline <= Instant::now();
                    if expired {
                        state.over = true;
                    }
                    expired
                };
                if expired {
                    shared.lost.cancel();
                    delete_until_done(&session, &shared.path).await;
                    break;
                }
            }
            () = shared.changed.notified() => {}
            event = async { match watch.as_mut() { Some(w) => w.await, None => std::future::pending().await } } => {
                watch = None;
                match event.map(|event| event.event_type) {
                    Some(EventType::NodeDeleted) => {
                        if !shared.state().over {
                            shared.lost.cancel();
                        }
                        break;
                    }
                    // Our own data write (an extension), a session event, or a watch that can no
                    // longer fire: watch again (a session that is over shows on `gone`).
                    _ => armed = false,
                }
            }
            () = session.gone.cancelled() => {
                shared.lost.cancel();
                let was_over = std::mem::replace(&mut shared.state().over, true);
                if !was_over {
                    delete_until_done(&session, &shared.path).await;
                }
                break;
            }
        }
    }
}

#[async_trait]
impl Lease for ZkLease {
    fn fence(&self) -> FencingToken {
        FencingToken::new(self.shared.fence)
    }

    fn lost(&self) -> &CancellationToken {
        &self.shared.lost
    }

    fn lease_start(&self) -> Instant {
        self.shared.start
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        let shared = &self.shared;
        let not_owned = || Error::not_owned(&shared.name);
        let now = Instant::now();
        let deadline = {
            let mut state = shared.state();
            if state.over || shared.lost.is_cancelled() || state.deadline <= now {
                return Err(not_owned());
            }
            // Moved before the write, so the keeper task cannot delete the node under it.
            state.deadline = state.deadline.max(now + ttl);
            state.deadline
        };
        shared.changed.notify_one();
        if shared.session.gone.is_cancelled() {
            shared.lost.cancel();
            return Err(not_owned());
        }
        // Suspended: the lock may or may not still be ours.
        shared.session.check()?;
        let result = if ttl.is_zero() {
            shared
                .session
                .client
                .check_stat(&shared.path)
                .await
                .map(|stat| stat.is_some_and(|s| s.ephemeral_owner == shared.session.id))
        } else {
            let left = deadline.saturating_duration_since(now);
            let deadline_ms = unix_ms(SystemTime::now() + left);
            let data = node_data(&shared.owner, shared.acquired_ms, deadline_ms);
            match shared
                .session
                .client
                .set_data(&shared.path, &data, None)
                .await
            {
                Ok(_) => Ok(true),
                Err(zookeeper_client::Error::NoNode) => Ok(false),
                Err(e) => Err(e),
            }
        };
        match result {
            Ok(true) => Ok(()),
            Ok(false) | Err(zookeeper_client::Error::SessionExpired) => {
                shared.lost.cancel();
                Err(not_owned())
            }
            Err(e) => Err(map(e, &shared.path)),
        }
    }

    async fn release(&self) -> Result<()> {
        let shared = &self.shared;
        {
            let mut state = shared.state();
            if state.over {
                return Err(Error::not_owned(&shared.name));
            }
            state.over = true;
        }
        shared.changed.notify_one();
        // Lost: by the keeper's deadline (renewals failed while the connection was suspended)
        // or a session given up on, the node may still exist, and the session may come back
        // with it; the lock would then stay held by nobody. Delete it (a no-op if it is gone).
        if shared.lost.is_cancelled() || shared.session.gone.is_cancelled() {
            let shared = shared.clone();
            tokio::spawn(async move {
                delete_until_done(&shared.session, &shared.path).await;
            });
            return Err(Error::not_owned(&self.shared.name));
        }
        match shared.session.client.delete(&shared.path, None).await {
            Ok(()) => Ok(()),
            Err(zookeeper_client::Error::NoNode) => Err(Error::not_owned(&shared.name)),
            Err(zookeeper_client::Error::SessionExpired) => {
                shared.lost.cancel();
                Err(Error::not_owned(&shared.name))
            }
            Err(error) => {
                // The node stays until it is deleted or the session ends: keep trying.
                let shared = shared.clone();
                tokio::spawn(async move {
                    delete_until_done(&shared.session, &shared.path).await;
                });
                Err(map(error, &self.shared.path))
            }
        }
    }
}

/// Reads a lock directory: the holder (the first node in line) and its data.
async fn inspect_dir(session: &Session, name: &str, dir: &str) -> Result<Option<LockInfo>> {
    // The holder can leave between the listing and the read: look again.
    for _ in 0..5 {
        let children = match session.client.list_children(dir).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => return Ok(None),
            Err(e) => return Err(map(e, dir)),
        };
        let Some((_, head)) = queue(children).into_iter().next() else {
            return Ok(None);
        };
        let path = format!("{dir}/{head}");
        let (data, stat) = match session.client.get_data(&path).await {
            Ok(found) => found,
            Err(zookeeper_client::Error::NoNode) => continue,
            Err(e) => return Err(map(e, &path)),
        };
        return Ok(Some(lock_info(name, &data, stat.czxid, stat.ctime)));
    }
    Err(Error::Unavailable {
        backend: BACKEND,
        source: format!("{dir} changed too often to be read").into(),
    })
}

fn lock_info(name: &str, data: &[u8], czxid: i64, ctime: i64) -> LockInfo {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(6, '\0');
    let version = parts.next();
    let number = |p: Option<&str>| p.and_then(|v| v.parse::<u64>().ok());
    let (at, deadline, pid, host, label) = if version == Some("dlock1") {
        (
            number(parts.next()),
            number(parts.next()),
            number(parts.next()),
            parts.next(),
            parts.next(),
        )
    } else {
        (None, None, None, None, None)
    };
    let at = at.unwrap_or_else(|| u64::try_from(ctime).unwrap_or(0));
    let now = unix_ms(SystemTime::now());
    LockInfo::new(
        name.to_owned(),
        FencingToken::new(u64::try_from(czxid).unwrap_or(0)),
        Owner::new(
            label.filter(|l| !l.is_empty()).map(str::to_owned),
            host.unwrap_or_default(),
            pid.and_then(|p| u32::try_from(p).ok()).unwrap_or(0),
        ),
        UNIX_EPOCH + Duration::from_millis(at),
        deadline.map(|d| Duration::from_millis(d.saturating_sub(now))),
        1,
    )
}

#[async_trait]
impl MonitorStore for ZookeeperBackend {
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let session = self.inner.session().await?;
        inspect_dir(&session, name.as_str(), &self.inner.dir(name.as_str())).await
    }

    async fn list_page(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ListPage> {
        let session = self.inner.session().await?;
        let root = &self.inner.config.chroot;
        // ZooKeeper lists a node's children in one reply; the page is cut from it here.
        let children = match session.client.list_children(root).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(e) => return Err(map(e, root)),
        };
        let mut names: Vec<String> = children
            .iter()
            .filter(|c| c.as_str() != values::VALUES_DIR)
            .filter_map(|c| decode_name(c))
            // Read-write locks and semaphores (`name NUL kind`) are not locks.
            .filter(|n| !n.contains('\0'))
            .filter(|n| n.starts_with(prefix) && cursor.is_none_or(|c| n.as_str() > c))
            .collect();
        names.sort_unstable();
        let limit = limit.max(1);
        let more = names.len() > limit;
        names.truncate(limit);
        let reads = names.iter().map(|name| {
            let session = session.clone();
            let dir = self.inner.dir(name);
            async move { inspect_dir(&session, name, &dir).await }
        });
        let mut locks = Vec::with_capacity(names.len());
        for info in futures::future::join_all(reads).await {
            if let Some(info) = info? {
                locks.push(info);
            }
        }
        let cursor = if more { names.last().cloned() } else { None };
        Ok(ListPage::new(locks, cursor))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let session = self.inner.session().await?;
        let dir = self.inner.dir(name.as_str());
        loop {
            let children = match session.client.list_children(&dir).await {
                Ok(children) => children,
                Err(zookeeper_client::Error::NoNode) => return Ok(false),
                Err(e) => return Err(map(e, &dir)),
            };
            let Some((_, head)) = queue(children).into_iter().next() else {
                return Ok(false);
            };
            let path = format!("{dir}/{head}");
            match session.client.delete(&path, None).await {
                Ok(()) => return Ok(true),
                // Released meanwhile: the next in line (if any) now holds it.
                Err(zookeeper_client::Error::NoNode) => continue,
                Err(e) => return Err(map(e, &path)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_keep_prefixes() {
        for name in ["orders/42", "Report", "заказы/🔒 x", ".", "..", "a.b"] {
            let encoded = encode_name(name);
            assert!(!encoded.contains('/'), "{encoded}");
            assert!(encoded != "." && encoded != "..");
            assert_eq!(decode_name(&encoded).as_deref(), Some(name));
        }
        assert!(encode_name("orders/42").starts_with(&encode_name("orders/")));
        assert_ne!(encode_name("Report"), encode_name("report"));
    }

    #[test]
    fn queue_orders_by_sequence_and_ignores_foreign_nodes() {
        let q = queue(vec![
            "_c_b-lock-0000000010".into(),
            "foreign".into(),
            "_c_a-lock-0000000002".into(),
            "_c_c-lock-x".into(),
        ]);
        let seqs: Vec<i64> = q.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, [2, 10]);
    }

    #[test]
    fn lock_info_reads_node_data() {
        let owner = Owner::new(Some("l\0x".into()), "h", 7);
        let data = node_data(&owner, 1000, u64::MAX);
        let info = lock_info("n", &data, 42, 0);
        assert_eq!(info.fence.get(), 42);
        assert_eq!(info.owner.pid, 7);
        assert_eq!(info.owner.host, "h");
        assert_eq!(info.owner.label.as_deref(), Some("l\0x"));
        assert!(info.ttl_left.is_some());
    }
}
