//! Taking the lock, as `run` and `hold` both do: options, waiting display, exit codes.

use std::io::IsTerminal;
use std::time::{Duration, SystemTime};

use clap::Args;

use crate::shown::shown;
use crate::{connect, exit, fail, parse_duration};

/// The options of every command that takes a lock.
#[derive(Debug, Args)]
pub(crate) struct LockArgs {
    /// The lock's name.
    pub(crate) name: String,

    /// Lease length, renewed by the watchdog while the lock is held (default 30s). If dlock is
    /// killed, the lock frees up within this.
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    pub(crate) ttl: Option<Duration>,

    /// Give up after this long (e.g. 30s, 5m); default: wait until acquired.
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true, conflicts_with = "no_wait")]
    pub(crate) wait: Option<Duration>,

    /// Do not wait: exit 75 at once if the lock is held.
    #[arg(long)]
    pub(crate) no_wait: bool,

    /// Queue fairly: waiters get the lock in arrival order, across processes.
    #[arg(long)]
    pub(crate) fair: bool,

    /// Stop renewing after this long: the lock then expires and counts as lost.
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    pub(crate) max_hold: Option<Duration>,

    /// Take one of N permits of the semaphore NAME instead of the lock: at most N holders at
    /// once (every taker must give the same N). Each permit is leased like a lock.
    #[arg(long, value_name = "N", conflicts_with = "fair")]
    pub(crate) permits: Option<u32>,

    /// Take the read side of the read-write lock NAME: any number of --shared holders at
    /// once, none beside an --exclusive one. The read-write lock NAME is not the lock NAME that
    /// a plain `dlock run NAME` takes: its writers use --exclusive.
    #[arg(long, conflicts_with_all = ["permits", "exclusive", "fair"])]
    pub(crate) shared: bool,

    /// Take the write side of the read-write lock NAME: alone, beside no --shared holder and no
    /// other --exclusive one.
    #[arg(long, conflicts_with_all = ["permits", "fair"])]
    pub(crate) exclusive: bool,

    /// The exit code when the lock is busy and --no-wait was given.
    #[arg(long, value_name = "CODE", default_value_t = exit::BUSY as u8)]
    pub(crate) busy_exit: u8,

    /// The exit code when the lock is lost and the command itself succeeded.
    #[arg(long, value_name = "CODE", default_value_t = exit::LOST as u8)]
    pub(crate) lost_exit: u8,

    /// Do not show who holds the lock while waiting, even on a terminal.
    #[arg(long, short)]
    pub(crate) quiet: bool,
}

/// What a command holds: a lock, one permit of a semaphore, a side of a read-write lock, or
/// the leadership of an election.
#[derive(Debug)]
pub(crate) enum Held {
    Lock(dlock::MutexGuard),
    Permit(dlock::Permit),
    Read(dlock::ReadGuard),
    Write(dlock::WriteGuard),
    Leader(dlock::Leadership),
}

impl Held {
    pub(crate) fn fence(&self) -> dlock::FencingToken {
        match self {
            Held::Lock(guard) => guard.fence(),
            Held::Permit(permit) => permit.fence(),
            Held::Read(reading) => reading.fence(),
            Held::Write(writing) => writing.fence(),
            Held::Leader(leading) => leading.term(),
        }
    }

    pub(crate) fn lost(&self) -> dlock::Lost<'_> {
        match self {
            Held::Lock(guard) => guard.lost(),
            Held::Permit(permit) => permit.lost(),
            Held::Read(reading) => reading.lost(),
            Held::Write(writing) => writing.lost(),
            Held::Leader(leading) => leading.lost(),
        }
    }

    pub(crate) async fn release(self) -> dlock::Result<()> {
        match self {
            Held::Lock(guard) => guard.release().await,
            Held::Permit(permit) => permit.release().await,
            Held::Read(reading) => reading.release().await,
            Held::Write(writing) => writing.release().await,
            Held::Leader(leading) => leading.resign().await,
        }
    }
}

/// One permit of `permits`, with the command's wait and hold options.
async fn take_permit(locks: &dlock::Locks, args: &LockArgs, permits: u32) -> dlock::Result<Held> {
    let mut builder = locks.semaphore(&args.name, permits);
    if let Some(max) = args.max_hold {
        builder = builder.max_hold(max);
    }
    if args.no_wait {
        builder = builder.no_wait();
    } else if let Some(wait) = args.wait {
        builder = builder.wait(wait);
    }
    builder.acquire().await.map(Held::Permit)
}

/// One side of the read-write lock `args.name`, with the command's wait and hold options.
async fn take_side(locks: &dlock::Locks, args: &LockArgs) -> dlock::Result<Held> {
    let mut builder = locks.rwlock(&args.name);
    if let Some(max) = args.max_hold {
        builder = builder.max_hold(max);
    }
    if args.no_wait {
        builder = builder.no_wait();
    } else if let Some(wait) = args.wait {
        builder = builder.wait(wait);
    }
    if args.shared {
        builder.read().await.map(Held::Read)
    } else {
        builder.write().await.map(Held::Write)
    }
}

/// Takes the lock; on failure, reports it and returns the exit code.
pub(crate) async fn take(url: &str, label: Option<String>, args: &LockArgs) -> Result<Held, i32> {
    let mut locks = connect(url, label).await?;
    if let Some(ttl) = args.ttl {
        locks = locks
            .with_watchdog_lease(ttl)
            .map_err(|e| fail(&e.into()))?;
    }
    if let Some(permits) = args.permits {
        return match take_permit(&locks, args, permits).await {
            Ok(held) => Ok(held),
            Err(dlock::Error::Timeout { waited, .. }) if waited.is_zero() => {
                eprintln!(
                    "dlock: all {permits} permits of {} are taken",
                    shown(&args.name)
                );
                Err(args.busy_exit.into())
            }
            Err(error) => Err(report_failure(&args.name, error)),
        };
    }
    if args.shared || args.exclusive {
        return match take_side(&locks, args).await {
            Ok(held) => Ok(held),
            Err(dlock::Error::Timeout { waited, .. }) if waited.is_zero() => {
                let by = if args.shared {
                    "a writer"
                } else {
                    "readers or a writer"
                };
                eprintln!(
                    "dlock: the read-write lock {} is held by {by}",
                    shown(&args.name)
                );
                Err(args.busy_exit.into())
            }
            Err(error) => Err(report_failure(&args.name, error)),
        };
    }
    let mut builder = locks.mutex(&args.name);
    if args.fair {
        builder = builder.fair();
    }
    if let Some(max) = args.max_hold {
        builder = builder.max_hold(max);
    }
    if args.no_wait {
        builder = builder.no_wait();
    } else if let Some(wait) = args.wait {
        builder = builder.wait(wait);
    }
    let status = (!args.quiet && !args.no_wait && std::io::stderr().is_terminal())
        .then(|| tokio::spawn(show_holder(locks.clone(), args.name.clone())));
    let acquired = builder.acquire().await;
    if let Some(status) = status {
        status.abort();
        eprint!("\r\x1b[2K");
    }
    match acquired {
        Ok(guard) => Ok(Held::Lock(guard)),
        Err(dlock::Error::Timeout { waited, .. }) if waited.is_zero() => {
            let holder = match locks.inspect(&args.name).await {
                Ok(Some(info)) => format!(" by {}", shown(&info.owner.to_string())),
                _ => String::new(),
            };
            eprintln!("dlock: {} is held{holder}", shown(&args.name));
            Err(args.busy_exit.into())
        }
        Err(error) => Err(report_failure(&args.name, error)),
    }
}

/// Reports a failed wait or a dlock error; returns the exit code.
pub(crate) fn report_failure(name: &str, error: dlock::Error) -> i32 {
    match error {
        dlock::Error::Timeout { waited, .. } => {
            eprintln!(
                "dlock: timed out after {} waiting for {}",
                humantime::format_duration(waited),
                shown(name),
            );
            exit::TIMED_OUT
        }
        e => fail(&e.into()),
    }
}

/// Shows who holds the lock, refreshed every second, until aborted.
async fn show_holder(locks: dlock::Locks, name: String) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    loop {
        if let Ok(Some(info)) = locks.inspect(&name).await {
            let held = SystemTime::now()
                .duration_since(info.acquired_at)
                .unwrap_or_default();
            let held = humantime::format_duration(Duration::from_secs(held.as_secs()));
            let ttl = info
                .ttl_left
                .map(|t| {
                    format!(
                        ", lease {} left",
                        humantime::format_duration(Duration::from_secs(t.as_secs()))
                    )
                })
                .unwrap_or_default();
            eprint!(
                "\r\x1b[2Kdlock: waiting for {}: held by {} for {held}{ttl}",
                shown(&name),
                shown(&info.owner.to_string())
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
