#![doc = include_str!("docs.md")]

mod acquire;
mod config;
pub(crate) mod driver;
mod error;
mod lease;
mod monitor;
mod queue_rules;
mod session;
mod session_holds;
mod session_lease;
mod values;

pub use config::{Acl, ZookeeperConfig};

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Mutex;
use zookeeper_client::Acls;

use crate::backend::abandon::Abandon;
use crate::backend::wait::{Backoff, Retries};
use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Lease, MonitorStore, ValueStore,
};
use crate::error::{Error, Result};

use acquire::Waiter;
use acquire::attempt;
use acquire::is_session_expired;
use error::{BACKEND, map};
use queue_rules::dir_name;
use queue_rules::encode_name;
use queue_rules::new_tag;
use session::Session;

/// URL schemes served by this backend.
pub const ZOOKEEPER_SCHEMES: &[&str] = &["zk", "zookeeper"];

const INFO: BackendInfo = BackendInfo::new(
    BACKEND,
    Capabilities {
        reentrant: false,
        // The queue of sequential nodes is FIFO by construction.
        fair: true,
        // The session: its expiry ends every hold.
        native_loss_signal: true,
        permits: true,
        fenced_writes: true,
        rwlock: true,
        ..Capabilities::SHARED_STORE
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
        acls_of(&self.config)
    }
}

/// The ACLs of every node this client creates.
fn acls_of(config: &ZookeeperConfig) -> Acls<'static> {
    match config.acl {
        Acl::Open => Acls::anyone_all(),
        Acl::Creator => Acls::creator_all(),
    }
}

#[async_trait]
impl Backend for ZookeeperBackend {
    fn info(&self) -> &BackendInfo {
        &INFO
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        crate::ttl::check_store_ttl(req.ttl)?;
        if req.reentrant {
            return Err(Error::Unsupported {
                operation: "reentrant locks",
                backend: BACKEND,
            });
        }
        let deadline = req.wait.deadline();
        let turn = req.kind;
        // However the call ends, what it left in the store goes.
        let mut waiter = Abandon::new(
            Waiter {
                inner: self.inner.clone(),
                dir: self.inner.dir(&dir_name(turn, req.name.as_str())),
                tag: new_tag(turn),
                turn,
                node: None,
                uncertain: None,
            },
            Waiter::abandon,
        );
        let mut retries = Retries::new(req.wait, Backoff::steady(RETRY_MIN, RETRY_MAX));
        let mut renewed = false;
        loop {
            match attempt(&mut waiter, req, deadline).await {
                Ok(granted) => return Ok(granted),
                // The session turned out to be over: once, at once, on a new one (even for
                // `no_wait`, whose answer must be about the lock, not about an old session).
                Err(error) if is_session_expired(&error) && !renewed => renewed = true,
                // A waiter rides out a suspended connection or a lost session until its
                // deadline (a new session queues again at the tail).
                Err(error) => retries.pause(error).await?,
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
