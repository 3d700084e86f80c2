//! A lock holder that writes through the checker service. Workers are OS processes (so
//! holders can be killed and frozen for real): the safety test binary runs itself again
//! with [`WORKER_ENV`] set and the worker's arguments, and its `main` hands over to
//! [`run_if_worker`] first. That binary is always built with the library under test, which
//! a separate binary of the test kit would not be (Cargo builds no binaries of a
//! dev-dependency). For the memory backend, workers are threads of the test process.
//!
//! Each round: `ATTEMPT`, acquire (a mutex, a reader or writer of a read-write lock, a
//! semaphore permit or a multi-lock, see [`Primitive`]), `BEGIN`, a few writes spread over
//! the hold (a reader reads), `END`, release. The writes do not check the lost signal first:
//! a holder frozen between its check and its write is exactly the case fencing exists for, so
//! the resource, not the holder, must refuse them. A hold that lasted past its fixed TTL, or
//! had a write refused, gives its guard's lost signal [`SIGNAL_TOLERANCE`] to arrive before it
//! ends, no more: the checker judges when the signal came, and a signal later than that is
//! missing from the record (an unsignalled overlap or stale write), never excused.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Mutex;

use super::canary::Canary;
use super::{HoldKind, SIGNAL_TOLERANCE};

/// Set (to any value) in a worker process's environment.
pub const WORKER_ENV: &str = "DLOCK_SAFETY_WORKER";

/// What the workers take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Primitive {
    /// A mutex.
    #[default]
    Mutex,
    /// A read-write lock: every third round of a worker writes, the others read.
    RwLock,
    /// A permit of a semaphore of this many.
    Semaphore(u32),
    /// A multi-lock of two names (`<name>/a`, `<name>/b`).
    MultiLock,
    /// Leadership of the election `<name>`: each round campaigns (publishing the worker's
    /// id), leads with the term as its fence, and resigns.
    Election,
}

impl Primitive {
    /// The worker argument's spelling: `mutex`, `rwlock`, `semaphore:N`, `multi`, `election`.
    pub fn as_arg(self) -> String {
        match self {
            Primitive::Mutex => "mutex".into(),
            Primitive::RwLock => "rwlock".into(),
            Primitive::Semaphore(n) => format!("semaphore:{n}"),
            Primitive::MultiLock => "multi".into(),
            Primitive::Election => "election".into(),
        }
    }

    /// The inverse of [`as_arg`](Self::as_arg).
    ///
    /// # Errors
    ///
    /// An unknown primitive.
    pub fn parse(text: &str) -> anyhow::Result<Primitive> {
        Ok(match text {
            "mutex" => Primitive::Mutex,
            "rwlock" => Primitive::RwLock,
            "multi" => Primitive::MultiLock,
            "election" => Primitive::Election,
            _ => match text.strip_prefix("semaphore:") {
                Some(n) => Primitive::Semaphore(n.parse()?),
                None => bail!("unknown primitive {text}"),
            },
        })
    }

    /// The names a multi-lock takes.
    pub fn multi_names(name: &str) -> [String; 2] {
        [format!("{name}/a"), format!("{name}/b")]
    }
}

/// A hold of any primitive.
pub(super) enum Held {
    Mutex(dlock::MutexGuard),
    Read(dlock::ReadGuard),
    Write(dlock::WriteGuard),
    Permit(dlock::Permit),
    /// With the fence of each name, in the order of [`Primitive::multi_names`].
    Multi(dlock::MultiGuard, Vec<dlock::FencingToken>),
    Leader(dlock::election::Leadership),
}

impl Held {
    /// A hold taken by the run itself, not by a worker: exclusive where the primitive has a
    /// choice (a writer), under the client's watchdog lease.
    pub(super) async fn take_exclusive(
        locks: &dlock::Locks,
        name: &str,
        primitive: Primitive,
        wait: Duration,
    ) -> dlock::Result<Held> {
        Ok(match primitive {
            Primitive::Mutex => Held::Mutex(locks.mutex(name).wait(wait).acquire().await?),
            Primitive::RwLock => Held::Write(locks.rwlock(name).wait(wait).write().await?),
            Primitive::Semaphore(n) => {
                Held::Permit(locks.semaphore(name, n).wait(wait).acquire().await?)
            }
            Primitive::MultiLock => {
                let names = Primitive::multi_names(name);
                let guard = locks.multi_lock(names.clone()).wait(wait).acquire().await?;
                let fences = multi_fences(&guard, &names);
                Held::Multi(guard, fences)
            }
            Primitive::Election => Held::Leader(
                locks
                    .election(name)
                    .wait(wait)
                    .campaign(leader_value(locks, std::process::id()))
                    .await?,
            ),
        })
    }

    /// The fence the hold writes with (a multi-lock's first name's).
    fn fence(&self) -> dlock::FencingToken {
        match self {
            Held::Mutex(g) => g.fence(),
            Held::Read(g) => g.fence(),
            Held::Write(g) => g.fence(),
            Held::Permit(g) => g.fence(),
            Held::Multi(_, fences) => fences[0],
            Held::Leader(g) => g.term(),
        }
    }

    /// The `BEGIN` line's rest: the fence, the kind's letter, a multi-lock's other fences or
    /// a composed permit's slot (`s<index>`, read from its slot lock's name, so the checker
    /// orders its fences on that slot).
    fn begin_line(&self) -> String {
        let mut line = format!("{} {}", self.fence().get(), self.kind().letter());
        match self {
            Held::Multi(_, fences) => {
                for fence in &fences[1..] {
                    line.push_str(&format!(" {}", fence.get()));
                }
            }
            Held::Permit(permit) => {
                if let Some((_, dlock::ComposedPart::PermitSlot { slot, .. })) =
                    dlock::ComposedPart::parse(permit.slot().as_str())
                {
                    line.push_str(&format!(" s{slot}"));
                }
            }
            _ => {}
        }
        line
    }

    fn kind(&self) -> HoldKind {
        match self {
            Held::Read(_) => HoldKind::Read,
            Held::Permit(_) => HoldKind::Permit,
            _ => HoldKind::Exclusive,
        }
    }

    fn lost_token(&self) -> tokio_util::sync::CancellationToken {
        match self {
            Held::Mutex(g) => g.lost_token(),
            Held::Read(g) => g.lost_token(),
            Held::Write(g) => g.lost_token(),
            Held::Permit(g) => g.lost_token(),
            Held::Multi(g, _) => g.lost_token(),
            Held::Leader(g) => g.lost_token(),
        }
    }

    pub(super) async fn release(self) -> dlock::Result<()> {
        match self {
            Held::Mutex(g) => g.release().await,
            Held::Read(g) => g.release().await,
            Held::Write(g) => g.release().await,
            Held::Permit(g) => g.release().await,
            Held::Multi(g, _) => g.release().await,
            Held::Leader(g) => g.resign().await,
        }
    }
}

/// What a leader publishes: its worker id, which the observer's reports are checked against
/// (nothing on a store without versioned values, where only an empty value can be published).
pub(super) fn leader_value(locks: &dlock::Locks, id: u32) -> Vec<u8> {
    if locks.backend().info().capabilities.values {
        id.to_string().into_bytes()
    } else {
        Vec::new()
    }
}

/// Each name's fence, in the order of `names` (0 for a name the guard does not know, which the
/// checker then reports as a regression).
fn multi_fences(guard: &dlock::MultiGuard, names: &[String]) -> Vec<dlock::FencingToken> {
    names
        .iter()
        .map(|name| guard.fence(name).unwrap_or(dlock::FencingToken::new(0)))
        .collect()
}

async fn acquire(locks: &dlock::Locks, config: &WorkerConfig, round: u64) -> dlock::Result<Held> {
    // Every builder takes the same two options: the wait, and a fixed TTL unless the client's
    // watchdog lease is used.
    macro_rules! options {
        ($builder:expr) => {{
            let builder = $builder.wait(config.wait);
            if config.watchdog {
                builder
            } else {
                builder.ttl(config.ttl)
            }
        }};
    }
    let name = config.name.clone();
    Ok(match config.primitive {
        Primitive::Mutex => Held::Mutex(options!(locks.mutex(name)).acquire().await?),
        Primitive::RwLock if round.is_multiple_of(3) => {
            Held::Write(options!(locks.rwlock(name)).write().await?)
        }
        Primitive::RwLock => Held::Read(options!(locks.rwlock(name)).read().await?),
        Primitive::Semaphore(n) => {
            Held::Permit(options!(locks.semaphore(name, n)).acquire().await?)
        }
        Primitive::MultiLock => {
            let names = Primitive::multi_names(&name);
            let guard = options!(locks.multi_lock(names.clone())).acquire().await?;
            let fences = multi_fences(&guard, &names);
            Held::Multi(guard, fences)
        }
        Primitive::Election => {
            let election = locks.election(name).wait(config.wait);
            let election = if config.watchdog {
                election
            } else {
                election.ttl(config.ttl)
            };
            Held::Leader(election.campaign(leader_value(locks, config.id)).await?)
        }
    })
}

/// What a worker does.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The store's URL.
    pub url: String,
    /// The lock's name.
    pub name: String,
    /// The checker service.
    pub checker: SocketAddr,
    /// The lease of every hold.
    pub ttl: Duration,
    /// How long each hold lasts (well under `ttl`).
    pub hold: Duration,
    /// How long each acquire may wait.
    pub wait: Duration,
    /// Hold with the watchdog (a lease of `ttl` renewed while held) rather than a fixed TTL.
    pub watchdog: bool,
    /// What the worker takes.
    pub primitive: Primitive,
    /// The promise its store breaks (a canary), if any.
    pub canary: Canary,
    /// Writes per hold.
    pub writes: u32,
    /// Every this many rounds (0: never) the hold lasts two leases, three or half a lease in
    /// turn instead of `hold`, so a watchdog hold is renewed while it is held.
    pub long_every: u32,
    /// The id the worker reports (its pid when it runs as a process).
    pub id: u32,
}

impl WorkerConfig {
    /// How long round `round` holds: `hold`, or every [`long_every`](Self::long_every)
    /// rounds (shifted by the worker's id, so the workers' long holds do not come at once)
    /// two leases, three or half a lease in turn.
    pub fn hold_of(&self, round: u64) -> Duration {
        let (every, shifted) = (u64::from(self.long_every), round + u64::from(self.id));
        if every == 0 || !shifted.is_multiple_of(every) {
            return self.hold;
        }
        // Two leases first: a short run still renews mid-hold.
        match (shifted / every) % 3 {
            0 => self.ttl / 2,
            1 => self.ttl * 2,
            _ => self.ttl * 3,
        }
    }
}

impl WorkerConfig {
    /// The binary's arguments for this configuration (the inverse of [`WorkerConfig::parse`];
    /// the id is the process's pid).
    pub fn args(&self) -> Vec<String> {
        vec![
            "--url".into(),
            self.url.clone(),
            "--name".into(),
            self.name.clone(),
            "--checker".into(),
            self.checker.to_string(),
            "--ttl-ms".into(),
            self.ttl.as_millis().to_string(),
            "--hold-ms".into(),
            self.hold.as_millis().to_string(),
            "--wait-ms".into(),
            self.wait.as_millis().to_string(),
            "--watchdog".into(),
            self.watchdog.to_string(),
            "--primitive".into(),
            self.primitive.as_arg(),
            "--canary".into(),
            self.canary.as_str().into(),
            "--writes".into(),
            self.writes.to_string(),
            "--long-every".into(),
            self.long_every.to_string(),
        ]
    }

    /// Parses the binary's arguments.
    ///
    /// # Errors
    ///
    /// An unknown, missing or malformed argument.
    pub fn parse(args: impl IntoIterator<Item = String>) -> anyhow::Result<WorkerConfig> {
        let mut args = args.into_iter();
        let (mut url, mut name, mut checker) = (None, None, None);
        let (mut ttl, mut hold, mut wait, mut watchdog) = (None, None, None, false);
        let (mut primitive, mut canary, mut writes) = (Primitive::Mutex, Canary::None, 4);
        let mut long_every = 0;
        while let Some(flag) = args.next() {
            let value = args
                .next()
                .with_context(|| format!("{flag} needs a value"))?;
            let millis = || value.parse::<u64>().map(Duration::from_millis);
            match flag.as_str() {
                "--url" => url = Some(value),
                "--name" => name = Some(value),
                "--checker" => checker = Some(value.parse()?),
                "--ttl-ms" => ttl = Some(millis()?),
                "--hold-ms" => hold = Some(millis()?),
                "--wait-ms" => wait = Some(millis()?),
                "--watchdog" => watchdog = value.parse()?,
                "--primitive" => primitive = Primitive::parse(&value)?,
                "--canary" => {
                    canary = Canary::parse(&value).with_context(|| format!("canary {value}"))?;
                }
                "--writes" => writes = value.parse()?,
                "--long-every" => long_every = value.parse()?,
                _ => bail!("unknown argument {flag}"),
            }
        }
        Ok(WorkerConfig {
            url: url.context("--url")?,
            name: name.context("--name")?,
            checker: checker.context("--checker")?,
            ttl: ttl.context("--ttl-ms")?,
            hold: hold.context("--hold-ms")?,
            wait: wait.context("--wait-ms")?,
            watchdog,
            primitive,
            canary,
            writes,
            long_every,
            id: std::process::id(),
        })
    }
}

/// One connection to the checker service, shared by the worker's rounds and its lost-signal
/// watcher.
#[derive(Debug, Clone)]
struct Checker {
    id: u32,
    conn: Arc<Mutex<(BufReader<OwnedReadHalf>, OwnedWriteHalf)>>,
}

impl Checker {
    async fn connect(addr: SocketAddr, id: u32) -> anyhow::Result<Checker> {
        let (read, write) = TcpStream::connect(addr).await?.into_split();
        Ok(Checker {
            id,
            conn: Arc::new(Mutex::new((BufReader::new(read), write))),
        })
    }

    async fn send(&self, verb: &str, rest: &str) -> anyhow::Result<String> {
        let mut conn = self.conn.lock().await;
        let line = format!("{verb} {} {rest}\n", self.id);
        conn.1.write_all(line.as_bytes()).await?;
        let mut reply = String::new();
        if conn.0.read_line(&mut reply).await? == 0 {
            bail!("the checker service closed the connection");
        }
        Ok(reply.trim_end().to_owned())
    }
}

/// In a worker process (see [`WORKER_ENV`]): runs the worker described by the arguments and
/// exits; otherwise returns at once. Call it first thing in the test binary's `main`.
pub fn run_if_worker() {
    if std::env::var_os(WORKER_ENV).is_none() {
        return;
    }
    // `DLOCK_LOG=debug` (a tracing filter) shows what the worker's client does, on stderr.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("DLOCK_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    let result = WorkerConfig::parse(std::env::args().skip(1)).and_then(|config| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
            .block_on(run(config))
    });
    match result {
        Ok(()) => std::process::exit(0),
        Err(error) => {
            eprintln!("safety worker {}: {error:#}", std::process::id());
            std::process::exit(1);
        }
    }
}

/// Runs rounds until the service answers `STOP`.
///
/// # Errors
///
/// The checker service could not be reached, or the client could not be made.
pub async fn run(config: WorkerConfig) -> anyhow::Result<()> {
    let checker = Checker::connect(config.checker, config.id).await?;
    let mut locks = connect(&config).await?;
    if config.canary.breaks_holders() {
        locks = dlock::Locks::from_backend(config.canary.wrap(locks.backend().clone()));
    }
    if config.watchdog {
        locks = locks.with_watchdog_lease(config.ttl)?;
    }
    let mut round = 0u64;
    while checker.send("ATTEMPT", "").await? == "GO" {
        round += 1;
        let guard = match acquire(&locks, &config, round).await {
            Ok(guard) => guard,
            Err(dlock::Error::Timeout { .. }) => {
                checker.send("TIMEOUT", "").await?;
                continue;
            }
            Err(error) => {
                checker.send("ERROR", &one_line(&error)).await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let started = Instant::now();
        let fence = guard.fence().get().to_string();
        let kind = guard.kind();
        checker.send("BEGIN", &guard.begin_line()).await?;
        let watcher = {
            let (checker, fence, lost) = (checker.clone(), fence.clone(), guard.lost_token());
            tokio::spawn(async move {
                lost.cancelled().await;
                let _ = checker.send("LOST", &fence).await;
            })
        };
        // A permit's fence says nothing about the other permits' writes: only holds that
        // exclude each other touch the resource.
        let verb = match kind {
            HoldKind::Exclusive => Some("WRITE"),
            HoldKind::Read => Some("READ"),
            HoldKind::Permit => None,
        };
        let mut refused = false;
        let (writes, hold) = (config.writes.max(1), config.hold_of(round));
        for _ in 0..writes {
            if let Some(verb) = verb {
                refused |= checker.send(verb, &fence).await?.starts_with("STALE");
            }
            tokio::time::sleep(hold / writes).await;
        }
        // A fixed lease that ran out, or a refused write: the signal is due already; give it
        // the tolerance to arrive, then end the hold whatever happened.
        if refused || (!config.watchdog && started.elapsed() >= config.ttl) {
            let _ = tokio::time::timeout(SIGNAL_TOLERANCE, async {
                while !watcher.is_finished() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
            .await;
        }
        checker.send("END", &fence).await?;
        // Before the release, whose completion also completes the lost signal.
        watcher.abort();
        let _ = guard.release().await;
    }
    Ok(())
}

async fn connect(config: &WorkerConfig) -> anyhow::Result<dlock::Locks> {
    connect_to(&config.url).await
}

/// A client of `url`, retried for a while: a server fault may be under way.
pub(super) async fn connect_to(url: &str) -> anyhow::Result<dlock::Locks> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match dlock::connect(url).await {
            Ok(locks) => return Ok(locks),
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => return Err(error).context("connect"),
        }
    }
}

fn one_line(error: &dlock::Error) -> String {
    error.to_string().replace('\n', " ")
}
