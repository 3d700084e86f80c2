//! A lock holder that writes through the checker service. Workers are OS processes (so
//! holders can be killed and frozen for real): the safety test binary runs itself again
//! with [`WORKER_ENV`] set and the worker's arguments, and its `main` hands over to
//! [`run_if_worker`] first. That binary is always built with the library under test, which
//! a separate binary of the test kit would not be (Cargo builds no binaries of a
//! dev-dependency). For the memory backend, workers are threads of the test process.
//!
//! Each round: `ATTEMPT`, acquire with a fixed TTL, `BEGIN`, a few writes spread over the
//! hold, `END`, release. The writes do not check the lost signal first: a holder frozen
//! between its check and its write is exactly the case fencing exists for, so the resource,
//! not the holder, must refuse them. A hold that lasted past its TTL, or had a write refused,
//! waits (up to two TTLs) for its guard to report the loss before it ends: the guard must.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Mutex;

/// Set (to any value) in a worker process's environment.
pub const WORKER_ENV: &str = "DLOCK_SAFETY_WORKER";

/// Writes per hold.
const WRITES_PER_HOLD: u32 = 4;

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
    /// The id the worker reports (its pid when it runs as a process).
    pub id: u32,
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
    if config.watchdog {
        locks = locks.with_watchdog_lease(config.ttl)?;
    }
    while checker.send("ATTEMPT", "").await? == "GO" {
        let mut mutex = locks.mutex(config.name.clone()).wait(config.wait);
        if !config.watchdog {
            mutex = mutex.ttl(config.ttl);
        }
        let acquired = mutex.acquire().await;
        let guard = match acquired {
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
        checker.send("BEGIN", &fence).await?;
        let watcher = {
            let (checker, fence, lost) = (checker.clone(), fence.clone(), guard.lost_token());
            tokio::spawn(async move {
                lost.cancelled().await;
                let _ = checker.send("LOST", &fence).await;
            })
        };
        let mut refused = false;
        for _ in 0..WRITES_PER_HOLD {
            refused |= checker.send("WRITE", &fence).await?.starts_with("STALE");
            tokio::time::sleep(config.hold / WRITES_PER_HOLD).await;
        }
        // A fixed lease that ran out, or a refused write: the guard must say it is lost.
        if refused || (!config.watchdog && started.elapsed() >= config.ttl) {
            let _ = tokio::time::timeout(config.ttl * 2, guard.lost()).await;
            // Let the watcher report it before the hold ends.
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                while !watcher.is_finished() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
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
    // A server fault may be under way when a worker starts; keep trying for a while.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match dlock::connect(&config.url).await {
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
