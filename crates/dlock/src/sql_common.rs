//! What the PostgreSQL and MySQL/MariaDB backends share: the mode and URL options, waiters'
//! in-process wake-ups, the undo of a grant whose caller went away, and the task that keeps a
//! session lock's connection.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::Lease;
use crate::error::{Error, Result, redact_url};
use crate::fence::FencingToken;
use crate::wait::Attempt;

/// How a SQL backend holds a lock; chosen per client with the URL option `mode`.
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "postgres")] {
/// use dlock::postgres::{Mode, PostgresConfig};
/// let config = PostgresConfig::from_url("postgres://app@db/locks?mode=session").unwrap();
/// assert_eq!(config.mode, Mode::Session);
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Mode {
    /// A row per lock in a lease table (`mode=lease`, the default): expiry by the database's
    /// clock, reentrant, works through transaction-mode connection poolers.
    #[default]
    Lease,
    /// A server-side session lock (`mode=session`): PostgreSQL advisory locks or MySQL
    /// `GET_LOCK`, held by a dedicated connection; freed by the server when that connection
    /// dies.
    Session,
}

/// Options every SQL backend reads from its URL, next to the driver's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Options {
    pub(crate) mode: Mode,
    pub(crate) table: Option<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_connections: Option<u32>,
    pub(crate) check_interval: Duration,
    pub(crate) poll_min: Duration,
    pub(crate) poll_max: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: Mode::Lease,
            table: None,
            connect_timeout: Duration::from_secs(5),
            max_connections: None,
            check_interval: Duration::from_secs(1),
            poll_min: Duration::from_millis(5),
            poll_max: Duration::from_millis(250),
        }
    }
}

/// The options dlock reads (and removes from the URL before the driver sees it).
pub(crate) const DLOCK_OPTIONS: &[&str] = &[
    "mode",
    "table",
    "connect_timeout",
    "max_connections",
    "check_interval",
    "poll_min",
    "poll_max",
];

/// Splits `url` into dlock's options and the URL the driver gets: `scheme` replaces the URL's
/// scheme (`mariadb` → `mysql`), and only `driver_options` may remain in the query.
pub(crate) fn split_url(
    url: &str,
    schemes: &[&str],
    scheme: &str,
    dlock_options: &[&str],
    driver_options: &[&str],
) -> Result<(Options, String)> {
    let invalid = |reason: String| Error::InvalidUrl {
        url: redact_url(url),
        reason,
    };
    let (given, rest) = url
        .split_once("://")
        .ok_or_else(|| invalid(format!("expected {scheme}://USER@HOST:PORT/DATABASE")))?;
    if !schemes.iter().any(|s| s.eq_ignore_ascii_case(given)) {
        return Err(invalid(format!("expected one of the schemes {schemes:?}")));
    }
    if rest.contains(['\0', '#']) {
        return Err(invalid("a NUL byte or a fragment in the URL".into()));
    }
    let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
    if base.is_empty() {
        return Err(invalid("missing host".into()));
    }
    let mut options = Options::default();
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if DLOCK_OPTIONS.contains(&key) && !dlock_options.contains(&key) {
            return Err(invalid(format!(
                "option {key:?} has no meaning for the {scheme} backend (its options: {})",
                dlock_options.join(", ")
            )));
        }
        let duration = || {
            humantime::parse_duration(value)
                .map_err(|e| invalid(format!("option {key}={value:?}: {e} (try 250ms or 5s)")))
        };
        match key {
            "mode" => {
                options.mode = match value {
                    "lease" => Mode::Lease,
                    "session" => Mode::Session,
                    _ => {
                        return Err(invalid(format!(
                            "option mode={value:?}: expected lease or session"
                        )));
                    }
                }
            }
            "table" => {
                check_identifier(value)
                    .map_err(|reason| invalid(format!("option table: {reason}")))?;
                options.table = Some(value.to_owned());
            }
            "connect_timeout" => options.connect_timeout = duration()?,
            "check_interval" => options.check_interval = duration()?,
            "poll_min" => options.poll_min = duration()?,
            "poll_max" => options.poll_max = duration()?,
            "max_connections" => {
                options.max_connections = Some(value.parse().map_err(|_| {
                    invalid(format!(
                        "option max_connections={value:?}: expected a number"
                    ))
                })?);
            }
            _ if driver_options.contains(&key) => kept.push(pair),
            _ => {
                return Err(invalid(format!(
                    "unknown option {key:?} (dlock: {}; driver: {})",
                    dlock_options.join(", "),
                    driver_options.join(", ")
                )));
            }
        }
    }
    options.validate().map_err(|e| invalid(e.to_string()))?;
    let mut driver_url = format!("{scheme}://{base}");
    if !kept.is_empty() {
        driver_url.push('?');
        driver_url.push_str(&kept.join("&"));
    }
    Ok((options, driver_url))
}

impl Options {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.poll_min.is_zero() || self.poll_min > self.poll_max {
            return Err(Error::invalid_argument(
                "poll_min/poll_max",
                "need 0 < poll_min <= poll_max",
            ));
        }
        if self.poll_max > Duration::from_secs(10) {
            return Err(Error::invalid_argument("poll_max", "above 10s"));
        }
        if self.connect_timeout.is_zero() || self.connect_timeout > Duration::from_secs(3600) {
            return Err(Error::invalid_argument(
                "connect_timeout",
                "must be between 1ms and 1h",
            ));
        }
        if self.check_interval < Duration::from_millis(10)
            || self.check_interval > Duration::from_secs(3600)
        {
            return Err(Error::invalid_argument(
                "check_interval",
                "must be between 10ms and 1h",
            ));
        }
        if self
            .max_connections
            .is_some_and(|max| max == 0 || max > 10_000)
        {
            return Err(Error::invalid_argument(
                "max_connections",
                "must be between 1 and 10000",
            ));
        }
        if let Some(table) = &self.table {
            check_identifier(table).map_err(|reason| Error::invalid_argument("table", reason))?;
        }
        Ok(())
    }
}

/// A table name is spliced into SQL, so only plain identifiers are accepted.
pub(crate) fn check_identifier(name: &str) -> std::result::Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || name.len() > 48 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(format!(
            "{name:?} is not a plain identifier (letters, digits and _, at most 48, not starting with a digit)"
        ));
    }
    Ok(())
}

/// The pool size when none is given: a lease-table client needs a few connections; a
/// session-mode client keeps one per held lock.
pub(crate) fn default_max_connections(mode: Mode) -> u32 {
    match mode {
        Mode::Lease => 20,
        Mode::Session => 100,
    }
}

/// Milliseconds, saturating, for SQL parameters.
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A fence read from a `BIGINT` column.
pub(crate) fn fence(value: i64) -> FencingToken {
    FencingToken::new(u64::try_from(value).unwrap_or(0))
}

/// Waiters of this process per lock name, woken by this client's releases (and, on
/// PostgreSQL, by NOTIFY from every other client).
#[derive(Debug, Default)]
pub(crate) struct Wakers {
    map: Mutex<HashMap<String, watch::Sender<()>>>,
}

impl Wakers {
    pub(crate) fn subscribe(&self, name: &str) -> watch::Receiver<()> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry(name.to_owned())
            .or_insert_with(|| watch::Sender::new(()))
            .subscribe()
    }

    pub(crate) fn wake(&self, name: &str) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = map.get(name) {
            sender.send_replace(());
            if sender.receiver_count() == 0 {
                map.remove(name);
            }
        }
    }

    /// Wakes every waiter (after a gap in which notifications may have been missed).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn wake_all(&self) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, sender| {
            sender.send_replace(());
            sender.receiver_count() > 0
        });
    }
}

/// A granted lease on its way to the caller. If nobody takes it (the acquire future was
/// dropped while the store was granting), dropping it releases the lock at once instead of
/// leaving it held for its TTL.
struct Granted(Option<Arc<dyn Lease>>);

impl Granted {
    fn take(mut self) -> Option<Arc<dyn Lease>> {
        self.0.take()
    }
}

impl Drop for Granted {
    fn drop(&mut self) {
        if let Some(lease) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                if let Err(error) = lease.release().await {
                    tracing::debug!(%error, "undoing an abandoned grant failed; the TTL frees it");
                }
                lease.lost().cancel();
            });
        }
    }
}

/// Runs one acquisition attempt in its own task, so the store call always completes: if the
/// caller drops the returned future after the store granted the lock, the grant is undone.
pub(crate) async fn detached_attempt<F>(attempt: F) -> Result<Attempt>
where
    F: Future<Output = Result<Attempt>> + Send + 'static,
{
    let task = tokio::spawn(async move {
        attempt.await.map(|attempt| match attempt {
            Attempt::Acquired(lease) => Ok(Granted(Some(lease))),
            other => Err(other),
        })
    });
    match task.await {
        Ok(Ok(Ok(granted))) => {
            granted
                .take()
                .map(Attempt::Acquired)
                .ok_or_else(|| Error::Backend {
                    backend: "sql",
                    source: "a granted lease went missing".into(),
                })
        }
        Ok(Ok(Err(busy))) => Ok(busy),
        Ok(Err(error)) => Err(error),
        Err(join) => Err(Error::Unavailable {
            backend: "sql",
            source: Box::new(join),
        }),
    }
}

/// A waiter whose queue entry has not been refreshed for this long is gone (crashed, paused,
/// cut off) and no longer holds anyone back: the same rule as the SQLite backend's queue.
pub(crate) const WAITER_STALE: Duration = Duration::from_secs(1);

/// How often a queued waiter refreshes its entry: its attempts never sleep longer than this,
/// well inside [`WAITER_STALE`] even with a slow round trip.
pub(crate) const WAITER_REFRESH: Duration = Duration::from_millis(300);

/// [`WAITER_STALE`] in milliseconds, for SQL text.
pub(crate) const WAITER_STALE_MS: u128 = WAITER_STALE.as_millis();

/// [`STARVATION_THRESHOLD`](crate::wait::STARVATION_THRESHOLD) in microseconds, for SQL text.
pub(crate) const STARVATION_US: u128 = crate::wait::STARVATION_THRESHOLD.as_micros();

/// One acquire call's place in a lease table's waiter queue.
#[derive(Debug, Default)]
pub(crate) struct QueueSpot {
    /// Whether an attempt left an entry in the queue (cleared when a grant or a leave
    /// removes it).
    pub(crate) queued: AtomicBool,
    /// Held by the attempt in flight, so leaving waits for it: an attempt that queues after
    /// the leave would leave an entry behind until it went stale.
    pub(crate) gate: tokio::sync::Mutex<()>,
    /// When this waiter last wrote its entry (the MySQL backend refreshes only now and then).
    pub(crate) refreshed: Mutex<Option<Instant>>,
}

impl QueueSpot {
    pub(crate) fn is_queued(&self) -> bool {
        self.queued.load(Ordering::SeqCst)
    }

    pub(crate) fn set_queued(&self, queued: bool) {
        self.queued.store(queued, Ordering::SeqCst);
        if !queued {
            *self
                .refreshed
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
        }
    }

    /// Whether the entry is due for a refresh, and if so, counts it as refreshed now.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn refresh_due(&self, every: Duration) -> bool {
        let mut at = self
            .refreshed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if at.is_some_and(|at| now.duration_since(at) < every) && self.is_queued() {
            return false;
        }
        *at = Some(now);
        true
    }
}

/// Takes a waiter out of the queue when its acquire call ends without the lock (timed out,
/// failed, or its future dropped). The leave runs in its own task, after any attempt in
/// flight; if it never runs, the entry goes stale after [`WAITER_STALE`].
pub(crate) struct LeaveQueue(Option<Pin<Box<dyn Future<Output = ()> + Send>>>);

impl LeaveQueue {
    /// `leave` removes the entry (and wakes whoever may be next); it runs only if an attempt
    /// queued.
    pub(crate) fn new<F>(spot: Arc<QueueSpot>, leave: F) -> LeaveQueue
    where
        F: Future<Output = ()> + Send + 'static,
    {
        LeaveQueue(Some(Box::pin(async move {
            let _gate = spot.gate.lock().await;
            if spot.queued.swap(false, Ordering::SeqCst) {
                leave.await;
            }
        })))
    }

    /// The call got the lock: the granting attempt already left the queue.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for LeaveQueue {
    fn drop(&mut self) {
        if let Some(leave) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(leave);
        }
    }
}

/// The sleep hint for a queued waiter: never past its next refresh, and sooner while it is
/// at the head of the queue (`head_poll`) where waking is by polling.
pub(crate) fn queued_hint(free_in: Option<Duration>, head_poll: Option<Duration>) -> Duration {
    let cap = head_poll.map_or(WAITER_REFRESH, |p| p.min(WAITER_REFRESH));
    free_in.map_or(cap, |f| f.min(cap))
}

/// The connection that holds one session lock.
#[async_trait]
pub(crate) trait SessionConn: Send + 'static {
    /// A cheap round trip: fails when the connection (and so the lock) is gone.
    async fn ping(&mut self) -> Result<()>;
    /// Releases the server-side lock; `Ok(false)` when the server says it was not held.
    async fn unlock(&mut self) -> Result<bool>;
    /// Gives the connection back for reuse (only after a clean unlock).
    fn recycle(self);
    /// Closes the connection without reuse; the server frees whatever it held.
    fn discard(self);
}

enum Command {
    Extend(Duration, Instant, oneshot::Sender<Result<()>>),
    Release(oneshot::Sender<Result<()>>),
}

/// One session lock: a task owns the connection, checks it at a cadence (the lost signal
/// fires when it dies), lets go when the lease's TTL runs out, and serves extend and release.
#[derive(Debug)]
pub(crate) struct SessionLease {
    name: String,
    fence: i64,
    lost: CancellationToken,
    start: Instant,
    commands: mpsc::Sender<Command>,
}

impl SessionLease {
    /// Starts the keeper task of a lock just taken on `conn`. `start` is the instant before
    /// the request that took it; the lease lasts `ttl` from there unless extended.
    pub(crate) fn start<C: SessionConn>(
        conn: C,
        name: String,
        fence: i64,
        start: Instant,
        ttl: Duration,
        check_interval: Duration,
    ) -> SessionLease {
        let (commands, inbox) = mpsc::channel(4);
        let lost = CancellationToken::new();
        tokio::spawn(keep_session(
            conn,
            name.clone(),
            inbox,
            lost.clone(),
            start + ttl,
            check_interval,
            ttl,
        ));
        SessionLease {
            name,
            fence,
            lost,
            start,
            commands,
        }
    }

    async fn ask(&self, make: impl FnOnce(oneshot::Sender<Result<()>>) -> Command) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        if self.commands.send(make(reply)).await.is_err() {
            return Err(Error::not_owned(&self.name));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(Error::not_owned(&self.name)))
    }
}

#[async_trait]
impl Lease for SessionLease {
    fn fence(&self) -> FencingToken {
        fence(self.fence)
    }

    fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    fn lease_start(&self) -> Instant {
        self.start
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        let started = Instant::now();
        self.ask(|reply| Command::Extend(ttl, started, reply)).await
    }

    async fn release(&self) -> Result<()> {
        self.ask(Command::Release).await
    }
}

async fn keep_session<C: SessionConn>(
    mut conn: C,
    name: String,
    mut inbox: mpsc::Receiver<Command>,
    lost: CancellationToken,
    mut deadline: Instant,
    check_interval: Duration,
    mut ttl: Duration,
) {
    let cadence = |ttl: Duration| (ttl / 3).clamp(Duration::from_millis(5), check_interval);
    let mut next_check = Instant::now() + cadence(ttl);
    loop {
        tokio::select! {
            command = inbox.recv() => match command {
                Some(Command::Extend(more, started, reply)) => {
                    if Instant::now() >= deadline {
                        let _ = reply.send(Err(Error::not_owned(&name)));
                        break;
                    }
                    match conn.ping().await {
                        Ok(()) => {
                            deadline = deadline.max(started + more);
                            ttl = ttl.max(more);
                            next_check = Instant::now() + cadence(ttl);
                            let _ = reply.send(Ok(()));
                        }
                        Err(error) => {
                            tracing::debug!(%name, %error, "session lock connection is gone");
                            let _ = reply.send(Err(Error::not_owned(&name)));
                            lost.cancel();
                            conn.discard();
                            return;
                        }
                    }
                }
                Some(Command::Release(reply)) => {
                    if Instant::now() >= deadline {
                        let _ = reply.send(Err(Error::not_owned(&name)));
                        break;
                    }
                    let result = conn.unlock().await;
                    lost.cancel();
                    match result {
                        Ok(true) => {
                            let _ = reply.send(Ok(()));
                            conn.recycle();
                        }
                        // Not held by this connection any more, or the connection died (and
                        // with it the lock): either way the hold was lost before the release.
                        Ok(false) | Err(_) => {
                            let _ = reply.send(Err(Error::not_owned(&name)));
                            conn.discard();
                        }
                    }
                    return;
                }
                // Every handle is gone without a release: let go now, not at the TTL.
                None => break,
            },
            () = tokio::time::sleep_until(deadline) => {
                tracing::debug!(%name, "session lock's lease ran out; letting go");
                break;
            }
            () = tokio::time::sleep_until(next_check) => {
                if let Err(error) = conn.ping().await {
                    tracing::warn!(%name, %error, "session lock lost: its connection is gone");
                    lost.cancel();
                    conn.discard();
                    return;
                }
                next_check = Instant::now() + cadence(ttl);
            }
        }
    }
    // Expired or abandoned: free the lock on the server, as a lease store would.
    lost.cancel();
    match conn.unlock().await {
        Ok(true) => conn.recycle(),
        _ => conn.discard(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_dlock_options_from_driver_options() {
        let (options, driver) = split_url(
            "mariadb://u:p@h:3306/db?mode=session&ssl-mode=disabled&table=my_locks&poll_max=1s",
            &["mysql", "mariadb"],
            "mysql",
            DLOCK_OPTIONS,
            &["ssl-mode"],
        )
        .unwrap();
        assert_eq!(options.mode, Mode::Session);
        assert_eq!(options.table.as_deref(), Some("my_locks"));
        assert_eq!(options.poll_max, Duration::from_secs(1));
        assert_eq!(driver, "mysql://u:p@h:3306/db?ssl-mode=disabled");
    }

    #[test]
    fn rejects_bad_options() {
        for url in [
            "postgres://h/db?mode=maybe",
            "postgres://h/db?bogus=1",
            "postgres://h/db?table=x;drop",
            "postgres://h/db?table=1abc",
            "postgres://h/db?poll_min=1s&poll_max=1ms",
            "postgres://h/db?connect_timeout=soon",
            "postgres://h/db?max_connections=0",
            "postgres://",
            "redis://h",
        ] {
            let result = split_url(url, &["postgres"], "postgres", DLOCK_OPTIONS, &["sslmode"]);
            assert!(matches!(result, Err(Error::InvalidUrl { .. })), "{url}");
        }
    }
}
