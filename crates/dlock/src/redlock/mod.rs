#![doc = include_str!("docs.md")]

mod config;
pub(crate) mod driver;
mod lease;
mod monitor;

pub use config::{MAX_NODES, RedlockConfig};

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ::redis::{FromRedisValue, Script};
use async_trait::async_trait;
use futures::StreamExt;
use futures::future::join_all;
use futures::stream::FuturesUnordered;
use rand::Rng;
use tokio::time::Instant;

use crate::backend::wait::{Attempt, Backoff, acquire_loop};
use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Lease, LeaseCore, MonitorStore, Wait,
};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::redis::error::{bad_reply, map};
use crate::redis::node::Node;
use crate::redis::wake::Waiter;
use crate::redis::{ms, owner_field};
use lease::RedlockLease;

/// URL schemes served by this backend.
pub const REDLOCK_SCHEMES: &[&str] = &["redlock", "redlocks"];

const BACKEND: &str = "redlock";

const INFO: BackendInfo = BackendInfo::new(
    BACKEND,
    Capabilities {
        reentrant: false,
        fair: false,
        native_wait: true,
        native_loss_signal: false,
        cross_process: true,
        monitor: true,
        list: true,
        values: false,
        permits: false,
        rwlock: false,
    },
);

fn script(body: &str) -> Script {
    Script::new(&format!("{}\n{body}", include_str!("scripts/common.lua")))
}

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| script(include_str!("scripts/acquire.lua")));
static SYNC: LazyLock<Script> = LazyLock::new(|| script(include_str!("scripts/sync.lua")));
static EXTEND: LazyLock<Script> = LazyLock::new(|| script(include_str!("scripts/extend.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| script(include_str!("scripts/release.lua")));

/// Builds a [`RedlockBackend`].
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// let backend = dlock::redlock::RedlockBuilder::new("redlock://a:6379,b:6379,c:6379")?
///     .node_timeout(Duration::from_millis(20))
///     .build()
///     .await?;
/// let locks = dlock::Locks::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct RedlockBuilder {
    config: RedlockConfig,
}

impl RedlockBuilder {
    /// A builder for the nodes of a `redlock://` URL; see [`RedlockConfig::from_url`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] as for [`RedlockConfig::from_url`].
    pub fn new(url: &str) -> Result<RedlockBuilder> {
        Ok(RedlockBuilder {
            config: RedlockConfig::from_url(url)?,
        })
    }

    /// A builder from a full config (nodes built with [`RedisConfig`](crate::redis::RedisConfig)).
    pub fn from_config(config: RedlockConfig) -> RedlockBuilder {
        RedlockBuilder { config }
    }

    /// See [`RedlockConfig::node_timeout`].
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.config.node_timeout = timeout;
        self
    }

    /// Connects to every node and checks that a quorum answers. Nodes that are down are
    /// connected to when they come back.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] / [`Error::InvalidUrl`] for bad options;
    /// [`Error::Unauthenticated`] when a node refuses the credentials; [`Error::Unavailable`]
    /// when fewer than a quorum of nodes answer.
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
    /// let backend = dlock::redlock::RedlockBuilder::new("redlock://a:6379,b:6379,c:6379")?.build().await?;
    /// # Ok(()) }
    /// ```
    pub async fn build(self) -> Result<RedlockBackend> {
        let config = self.config;
        config.validate()?;
        // Built now, on the connecting thread: a process forked while another thread builds
        // them (a first acquire) would find them half-built for good.
        for script in [&ACQUIRE, &SYNC, &EXTEND, &RELEASE] {
            LazyLock::force(script);
        }
        let nodes = connect_nodes(&config).await?;
        let answers = join_all(nodes.iter().zip(&config.nodes).map(|(node, options)| {
            tokio::time::timeout(
                options.connect_timeout + options.response_timeout,
                node.ping(),
            )
        }))
        .await;
        let mut up = 0;
        let mut errors = Vec::new();
        for (index, answer) in answers.into_iter().enumerate() {
            let node = config.node_label(index);
            match answer {
                Ok(Ok(())) => up += 1,
                Ok(Err(
                    error @ (Error::Unauthenticated { .. } | Error::PermissionDenied { .. }),
                )) => {
                    return Err(on_node(&node, error));
                }
                Ok(Err(error)) => errors.push(on_node(&node, error)),
                Err(_) => {
                    let limit =
                        config.nodes[index].connect_timeout + config.nodes[index].response_timeout;
                    errors.push(on_node(
                        &node,
                        unavailable(&format!("no answer to PING within {limit:?}")),
                    ));
                }
            }
        }
        if up < config.quorum() {
            return Err(too_few_answered(
                up,
                config.nodes.len(),
                config.quorum(),
                &errors,
            ));
        }
        Ok(RedlockBackend {
            inner: Arc::new(Inner { nodes, config }),
        })
    }
}

fn unavailable(reason: &str) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        source: reason.to_owned().into(),
    }
}

/// `error` from the node `node` (`node 2 (redis://h2:6379)`), as Redlock's own: the backend
/// named `redlock`, the node named in the message, the variant kept.
fn on_node(node: &str, error: Error) -> Error {
    let tagged = |source: crate::error::BoxError| -> crate::error::BoxError {
        format!(
            "{node}: {}",
            Error::Backend {
                backend: BACKEND,
                source
            }
            .cause_text()
        )
        .into()
    };
    match error {
        Error::Unavailable { source, .. } => Error::Unavailable {
            backend: BACKEND,
            source: tagged(source),
        },
        Error::Unauthenticated { source, .. } => Error::Unauthenticated {
            backend: BACKEND,
            source: tagged(source),
        },
        Error::PermissionDenied { source, .. } => Error::PermissionDenied {
            backend: BACKEND,
            source: tagged(source),
        },
        Error::Backend { source, .. } => Error::Backend {
            backend: BACKEND,
            source: tagged(source),
        },
        Error::WrongType { key, detail, .. } => Error::WrongType {
            backend: BACKEND,
            key: format!("{key} on {node}"),
            detail,
        },
        other => other,
    }
}

/// The error of a round that too many nodes failed: every node's error, each naming its node.
fn no_quorum(what: String, errors: &[Error]) -> Error {
    let each: Vec<String> = errors.iter().map(Error::cause_text).collect();
    unavailable(&format!("{what}; {}", each.join("; ")))
}

/// No quorum because only `answered` of the `nodes` answered, `quorum` being needed.
fn too_few_answered(answered: usize, nodes: usize, quorum: usize, errors: &[Error]) -> Error {
    no_quorum(
        format!("only {answered} of {nodes} nodes answered, {quorum} needed"),
        errors,
    )
}

/// One lock over N independent Redis nodes: the Redlock algorithm, with every node contacted
/// in parallel, a per-node timeout, clock-drift allowance, fences that stay monotonic while a
/// majority of nodes keep their data, and pub/sub hand-off.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379").await?;
/// let guard = locks.mutex("billing/run").acquire().await?;
/// println!("fence {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    nodes: Vec<Node>,
    config: RedlockConfig,
}

impl RedlockBackend {
    /// Connects to the nodes of a `redlock://` URL; see [`RedlockConfig::from_url`].
    ///
    /// # Errors
    ///
    /// As [`RedlockConfig::from_url`] and [`RedlockBuilder::build`].
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
    /// let backend = dlock::redlock::RedlockBackend::connect_url("redlock://a:6379,b:6379,c:6379").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_url(url: &str) -> Result<RedlockBackend> {
        RedlockBuilder::new(url)?.build().await
    }

    /// The options this client runs with.
    pub fn config(&self) -> &RedlockConfig {
        &self.inner.config
    }
}

/// A lazy connection to every node of `config` (made on the first command: a node may be
/// down).
async fn connect_nodes(config: &RedlockConfig) -> Result<Vec<Node>> {
    let mut nodes = Vec::with_capacity(config.nodes.len());
    for (index, node) in config.nodes.iter().enumerate() {
        let connected = Node::connect(node, false).await;
        nodes.push(connected.map_err(|error| on_node(&config.node_label(index), error))?);
    }
    Ok(nodes)
}

/// The keys and channel of one lock name on every node.
#[derive(Clone, Debug)]
struct Keys {
    lock: String,
    fence: String,
    channel: String,
}

impl Keys {
    fn new(prefix: &str, name: &str) -> Keys {
        Keys {
            lock: format!("{prefix}rlock:{name}"),
            fence: format!("{prefix}rfence:{name}"),
            channel: format!("{prefix}wake:{name}"),
        }
    }
}

/// A script call with its keys and arguments, owned, so it can outlive the round that sent it.
type Invocation = ::redis::ScriptInvocation<'static>;

/// What one node answered, within the per-node timeout.
enum Answer<T> {
    Reply(T),
    Failed(Error),
}

impl Inner {
    /// The key prefix, the same on every node (the config checks it).
    fn prefix(&self) -> &str {
        self.config
            .nodes
            .first()
            .map_or("", |node| node.prefix.as_str())
    }

    fn quorum(&self) -> usize {
        self.config.quorum()
    }

    /// The per-node timeout for a lease of `ttl`: much smaller than the TTL.
    fn node_timeout(&self, ttl: Duration) -> Duration {
        self.config
            .node_timeout
            .min(ttl / 3)
            .max(Duration::from_millis(1))
    }

    /// Every node's index.
    fn all(&self) -> Vec<usize> {
        (0..self.nodes.len()).collect()
    }

    /// Runs `invocation` on the nodes at `indexes` at once, each bounded by `timeout`, and
    /// waits for every answer (`None` for the nodes not asked).
    async fn on_nodes<T: FromRedisValue + Send + 'static>(
        &self,
        indexes: &[usize],
        timeout: Duration,
        key: &str,
        invocation: impl Fn() -> Invocation,
    ) -> Vec<Option<Answer<T>>> {
        self.ask(indexes, timeout, key, invocation, |_| false).await
    }

    /// Runs `invocation` on the nodes at `indexes` at once, each bounded by `timeout`, until
    /// `enough` says the answers so far decide the round; the nodes still to answer (`None`)
    /// finish in the background, so a slow node never holds up a decided round.
    async fn ask<T: FromRedisValue + Send + 'static>(
        &self,
        indexes: &[usize],
        timeout: Duration,
        key: &str,
        invocation: impl Fn() -> Invocation,
        enough: impl Fn(&[Option<Answer<T>>]) -> bool,
    ) -> Vec<Option<Answer<T>>> {
        let mut pending: FuturesUnordered<_> = indexes
            .iter()
            .map(|&index| {
                let mut conn = self.nodes[index].conn();
                let invocation = invocation();
                let key = key.to_owned();
                let node = self.config.node_label(index);
                async move {
                    let answer = match tokio::time::timeout(
                        timeout,
                        invocation.invoke_async::<T>(&mut conn),
                    )
                    .await
                    {
                        Ok(Ok(reply)) => Answer::Reply(reply),
                        Ok(Err(error)) => Answer::Failed(on_node(&node, map(error, &key))),
                        Err(_) => Answer::Failed(on_node(
                            &node,
                            unavailable(&format!(
                                "no answer within the node timeout of {timeout:?}"
                            )),
                        )),
                    };
                    (index, answer)
                }
            })
            .collect();
        let mut answers: Vec<Option<Answer<T>>> = (0..self.nodes.len()).map(|_| None).collect();
        while let Some((index, answer)) = pending.next().await {
            answers[index] = Some(answer);
            if enough(&answers) {
                break;
            }
        }
        if !pending.is_empty()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move { while pending.next().await.is_some() {} });
        }
        answers
    }

    /// Releases `token` on the nodes at `indexes` at once; returns once a quorum let go (or
    /// too many refused for one to), the rest finish in the background. Returns (released,
    /// not ours, failed) counts.
    async fn release_on(
        &self,
        indexes: &[usize],
        keys: &Keys,
        token: &str,
        timeout: Duration,
    ) -> (usize, usize, Vec<Error>) {
        let (quorum, others) = (self.quorum(), self.nodes.len() - self.quorum());
        let answers = self
            .ask::<i64>(
                indexes,
                timeout,
                &keys.lock,
                || {
                    let mut invocation = RELEASE.key(&keys.lock);
                    invocation.arg(token).arg(&keys.channel);
                    invocation
                },
                |answers| {
                    let released = answers
                        .iter()
                        .filter(|a| matches!(a, Some(Answer::Reply(1))))
                        .count();
                    let refused = answers
                        .iter()
                        .filter(|a| matches!(a, Some(Answer::Reply(r)) if *r != 1))
                        .count();
                    released >= quorum || refused > others
                },
            )
            .await;
        let mut counts = (0, 0, Vec::new());
        for answer in answers.into_iter().flatten() {
            match answer {
                Answer::Reply(1) => counts.0 += 1,
                Answer::Reply(_) => counts.1 += 1,
                Answer::Failed(error) => counts.2.push(error),
            }
        }
        counts
    }

    /// One Redlock round: ask every node, keep the lock if a quorum granted it in time.
    async fn attempt(
        self: &Arc<Self>,
        keys: &Keys,
        req: &AcquireRequest,
        owner: &str,
    ) -> Result<Attempt> {
        let start = Instant::now();
        let timeout = self.node_timeout(req.ttl);
        let invocation = || {
            let mut invocation = ACQUIRE.key(&keys.lock);
            invocation
                .key(&keys.fence)
                .arg(&req.token)
                .arg(ms(req.ttl))
                .arg(owner);
            invocation
        };
        let quorum = self.quorum();
        let others = self.nodes.len() - quorum;
        // Decided once a quorum granted, or once too many refused or failed for one to.
        let answers = self
            .ask::<Vec<i64>>(&self.all(), timeout, &keys.lock, invocation, |answers| {
                let granted = answers
                    .iter()
                    .filter(|a| matches!(a, Some(Answer::Reply(r)) if r.first() == Some(&1)))
                    .count();
                let against = answers
                    .iter()
                    .filter(|a| {
                        matches!(a, Some(Answer::Failed(_)))
                            || matches!(a, Some(Answer::Reply(r)) if r.first() != Some(&1))
                    })
                    .count();
                granted >= quorum || against > others
            })
            .await;
        let mut granted = Vec::new();
        let mut busy_for = Vec::new();
        let mut errors = Vec::new();
        // Nodes that granted, or may have (no answer yet, or none in time): a failed round
        // lets go of these only, never of nodes that were busy (the same token may hold them
        // from an earlier call).
        let mut undo = Vec::new();
        for (index, answer) in answers.into_iter().enumerate() {
            let Some(answer) = answer else {
                undo.push(index);
                continue;
            };
            match answer {
                Answer::Reply(reply) => match reply.as_slice() {
                    [1, fence] => {
                        granted.push((index, *fence));
                        undo.push(index);
                    }
                    [0, left] => busy_for.push(*left),
                    _ => errors.push(bad_reply("redlock acquire")),
                },
                Answer::Failed(error) => {
                    errors.push(error);
                    undo.push(index);
                }
            }
        }
        if let Some(error) = errors
            .iter()
            .position(|e| !e.is_retryable())
            .map(|i| errors.swap_remove(i))
        {
            self.release_on(&undo, keys, &req.token, timeout).await;
            return Err(error);
        }
        if granted.len() >= self.quorum()
            && let Some(fence) = self.settle_fence(keys, req, owner, &granted, timeout).await
        {
            // Clock drift between this host and the nodes: 1 % of the TTL plus 2 ms, as the
            // lease keeper also allows for.
            let drift = Duration::from_millis(2) + req.ttl / 100;
            if start.elapsed() + drift < req.ttl {
                return Ok(Attempt::Acquired(Arc::new(RedlockLease {
                    inner: self.clone(),
                    keys: keys.clone(),
                    token: req.token.clone(),
                    owner: owner.to_owned(),
                    fence,
                    core: LeaseCore::new(FencingToken::from_signed(fence), start),
                })));
            }
        }
        // No quorum in time: let go at once, so a competitor can win.
        self.release_on(&undo, keys, &req.token, timeout).await;
        if errors.len() > others {
            let reached = self.nodes.len() - errors.len();
            return Err(too_few_answered(
                reached,
                self.nodes.len(),
                self.quorum(),
                &errors,
            ));
        }
        if !granted.is_empty() {
            // A split vote: several clients each got a minority. Back off a random moment so
            // one of them wins the next round.
            let pause = rand::rng().random_range(0..=timeout.as_micros().min(5000) as u64);
            tokio::time::sleep(Duration::from_micros(pause)).await;
            return Ok(Attempt::Busy {
                free_in: Some(Duration::ZERO),
            });
        }
        busy_for.sort_unstable();
        // The lock is free once a quorum of nodes has let it go.
        let free_in = busy_for
            .get(busy_for.len().saturating_sub(self.quorum()))
            .and_then(|left| u64::try_from(*left).ok())
            .map(Duration::from_millis);
        Ok(Attempt::Busy { free_in })
    }

    /// The hold's fence: the highest any granting node gave, written back to the granting
    /// nodes that gave less, so whoever wins next on any majority continues above it. `None`
    /// when fewer than a quorum end up holding it at that fence.
    async fn settle_fence(
        &self,
        keys: &Keys,
        req: &AcquireRequest,
        owner: &str,
        granted: &[(usize, i64)],
        timeout: Duration,
    ) -> Option<i64> {
        let fence = granted.iter().map(|(_, f)| *f).max()?;
        let behind: Vec<usize> = granted
            .iter()
            .filter(|(_, f)| *f < fence)
            .map(|(i, _)| *i)
            .collect();
        if behind.is_empty() {
            return Some(fence);
        }
        let synced = self
            .on_nodes::<i64>(&behind, timeout, &keys.lock, || {
                let mut invocation = SYNC.key(&keys.lock);
                invocation
                    .key(&keys.fence)
                    .arg(&req.token)
                    .arg(fence)
                    .arg(owner);
                invocation
            })
            .await;
        let in_line = synced
            .iter()
            .filter(|a| matches!(a, Some(Answer::Reply(1))))
            .count();
        let failed = behind.len() - in_line;
        (granted.len() - failed >= self.quorum()).then_some(fence)
    }
}

#[async_trait]
impl Backend for RedlockBackend {
    fn info(&self) -> &BackendInfo {
        &INFO
    }

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        Some(self)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        crate::ttl::check_store_ttl(req.ttl)?;
        let inner = &self.inner;
        let keys = Keys::new(inner.prefix(), req.name.as_str());
        let owner = owner_field(&req.owner);
        // A release on any node wakes the waiter.
        let waiters: Vec<Waiter> = if req.wait == Wait::No {
            Vec::new()
        } else {
            inner
                .nodes
                .iter()
                .map(|node| node.wakeups.waiter(&keys.channel, &req.token))
                .collect()
        };
        let poll = inner.config.nodes.first().map_or(
            Backoff::new(Duration::from_millis(20), Duration::from_millis(250)),
            |n| Backoff::new(n.poll_min, n.poll_max),
        );
        // Dropped mid-attempt, some nodes may have granted: let go of them in the background
        // rather than at the end of the lease (the token is unique to this call).
        let mut abandon = Abandon {
            inner: inner.clone(),
            keys: keys.clone(),
            token: req.token.clone(),
            armed: true,
        };
        let acquired = acquire_loop(
            req.wait,
            Some(poll),
            || inner.attempt(&keys, req, &owner),
            || async {
                if waiters.is_empty() {
                    std::future::pending::<()>().await;
                } else {
                    futures::future::select_all(waiters.iter().map(|w| Box::pin(w.woken()))).await;
                }
            },
        )
        .await;
        // A finished round has already cleaned up after itself.
        abandon.armed = false;
        acquired
    }
}

/// Lets go of the nodes an acquire call may hold when the call is dropped mid-round.
struct Abandon {
    inner: Arc<Inner>,
    keys: Keys,
    token: String,
    armed: bool,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the leases expire on their own
        };
        let (inner, keys, token) = (
            self.inner.clone(),
            self.keys.clone(),
            std::mem::take(&mut self.token),
        );
        runtime.spawn(async move {
            let timeout = inner.node_timeout(Duration::from_secs(1));
            inner.release_on(&inner.all(), &keys, &token, timeout).await;
        });
    }
}
