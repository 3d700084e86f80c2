//! Rust lock crates measured by `dlock bench --peer`, speaking its peer protocol:
//!
//! ```text
//! dlock-bench-peers <library> uncontended <pairs>                 one pair latency (µs) a line
//! dlock-bench-peers <library> worker <name> <duration_ms> <hold_us>
//!                                            one hold a line: acquired_ns released_ns waited_ns
//! ```
//!
//! The store's URL is in `DLOCK_PEER_URL` (not on the command line, where `ps` shows it).
//!
//! Libraries: `rslock` (its `acquire`, which retries `lock` with its default 3 × up to 200 ms)
//! and `distributed-lock` (the project's Redis backend, `distributed-lock-redis`: its
//! `try_acquire`, retried every millisecond, since its `acquire` does not wait). Both hold
//! with a busy loop, like dlock's workers, and run on a one-thread runtime, like `dlock bench`.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use distributed_lock_core::{DistributedLock, LockHandle, LockProvider};

const TTL: Duration = Duration::from_secs(30);
/// How often the distributed-lock peer retries a busy lock.
const RETRY: Duration = Duration::from_millis(1);

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn busy(hold: Duration) {
    let until = Instant::now() + hold;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// One library's acquire and release, behind one interface.
enum Client {
    Rslock(rslock::LockManager),
    DistributedLock(distributed_lock_redis::RedisLockProvider),
}

impl Client {
    async fn connect(library: &str, url: &str) -> anyhow::Result<Client> {
        Ok(match library {
            "rslock" => Client::Rslock(rslock::LockManager::new(vec![url.to_owned()])),
            "distributed-lock" => Client::DistributedLock(
                distributed_lock_redis::RedisLockProvider::builder()
                    .url(url)
                    .expiry(TTL)
                    .build()
                    .await?,
            ),
            other => bail!("unknown library {other} (rslock, distributed-lock)"),
        })
    }

    /// Acquires `name` (waiting up to `wait`), holds it for `hold`, releases it; returns when
    /// it was acquired and released, or `None` when the wait ran out.
    async fn hold_once(
        &self,
        name: &str,
        wait: Duration,
        hold: Duration,
    ) -> anyhow::Result<Option<(u128, u128)>> {
        match self {
            Client::Rslock(manager) => {
                let Ok(Ok(guard)) = tokio::time::timeout(wait, manager.acquire(name, TTL)).await
                else {
                    return Ok(None);
                };
                let acquired = now_ns();
                busy(hold);
                let released = now_ns();
                guard.release().await;
                Ok(Some((acquired, released)))
            }
            Client::DistributedLock(provider) => {
                let lock = provider.create_lock(name);
                // Its `acquire` makes one attempt and fails when the lock is busy (0.2.0), so
                // wait the way its users must: retry, here every millisecond.
                let deadline = Instant::now() + wait;
                let handle = loop {
                    if let Some(handle) = lock.try_acquire().await? {
                        break handle;
                    }
                    if Instant::now() >= deadline {
                        return Ok(None);
                    }
                    tokio::time::sleep(RETRY).await;
                };
                let acquired = now_ns();
                busy(hold);
                let released = now_ns();
                handle.release().await?;
                Ok(Some((acquired, released)))
            }
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).context("usage: see the module docs");
    let url = std::env::var("DLOCK_PEER_URL").context("DLOCK_PEER_URL is not set")?;
    let client = Client::connect(arg(0)?, &url).await?;
    match arg(1)?.as_str() {
        "uncontended" => {
            let pairs: usize = arg(2)?.parse()?;
            let name = format!("peer-bench/uncontended/{}", std::process::id());
            let second = Duration::from_secs(1);
            for _ in 0..50 {
                client.hold_once(&name, second, Duration::ZERO).await?;
            }
            let mut lines = Vec::with_capacity(pairs);
            for _ in 0..pairs {
                let t = Instant::now();
                client
                    .hold_once(&name, second, Duration::ZERO)
                    .await?
                    .context("an uncontended acquire timed out")?;
                lines.push(format!("{:.3}", t.elapsed().as_secs_f64() * 1e6));
            }
            println!("{}", lines.join("\n"));
        }
        "worker" => {
            let name = arg(2)?;
            let deadline = Instant::now() + Duration::from_millis(arg(3)?.parse()?);
            let hold = Duration::from_micros(arg(4)?.parse()?);
            let mut lines = Vec::new();
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let asked = now_ns();
                let Some((acquired, released)) = client.hold_once(name, left, hold).await? else {
                    break;
                };
                lines.push(format!("{acquired} {released} {}", acquired - asked));
            }
            println!("{}", lines.join("\n"));
        }
        other => bail!("unknown mode {other} (uncontended, worker)"),
    }
    Ok(())
}
