//! `dlock hold NAME`: the cross-process lock taker used by tests and scripts.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use tokio::io::AsyncReadExt;
use tokio::signal::unix::{SignalKind, signal};

use crate::{WaitArgs, connect, exit, fail, parse_duration};

#[derive(Debug, Args)]
pub(crate) struct HoldArgs {
    /// The lock's name.
    name: String,

    /// Lease length, renewed by the watchdog while held (default 30s); a killed holder's lock
    /// frees up within this.
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<Duration>,

    #[command(flatten)]
    wait: WaitArgs,

    /// Queue fairly: waiters get the lock in arrival order, across processes.
    #[arg(long)]
    fair: bool,
}

pub(crate) async fn hold(url: &str, label: Option<String>, args: HoldArgs) -> i32 {
    let label = label.or_else(|| Some("dlock hold".into()));
    let mut locks = match connect(url, label).await {
        Ok(locks) => locks,
        Err(code) => return code,
    };
    if let Some(ttl) = args.ttl {
        locks = match locks.with_watchdog_lease(ttl) {
            Ok(locks) => locks,
            Err(e) => return fail(&e.into()),
        };
    }
    let mut builder = locks.mutex(&args.name);
    if args.fair {
        builder = builder.fair();
    }
    if args.wait.no_wait {
        builder = builder.no_wait();
    } else if let Some(wait) = args.wait.wait {
        builder = builder.wait(wait);
    }
    let guard = match builder.acquire().await {
        Ok(guard) => guard,
        Err(dlock::Error::Timeout { waited, .. }) if waited.is_zero() => {
            eprintln!("dlock: {} is held elsewhere", args.name);
            return exit::BUSY;
        }
        Err(dlock::Error::Timeout { waited, .. }) => {
            eprintln!(
                "dlock: timed out after {} waiting for {}",
                humantime::format_duration(waited),
                args.name
            );
            return exit::TIMED_OUT;
        }
        Err(e) => return fail(&e.into()),
    };
    let mut out = std::io::stdout();
    if writeln!(out, "acquired {}", guard.fence())
        .and_then(|()| out.flush())
        .is_err()
    {
        // Nobody is listening any more; let go.
        let _ = guard.release().await;
        return exit::FAILED;
    }
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => (term, int),
        (Err(e), _) | (_, Err(e)) => return fail(&e.into()),
    };
    let stdin_closed = async {
        let mut sink = [0u8; 256];
        let mut stdin = tokio::io::stdin();
        while matches!(stdin.read(&mut sink).await, Ok(n) if n > 0) {}
    };
    tokio::select! {
        () = guard.lost() => {
            eprintln!("dlock: lock {} lost", args.name);
            return exit::LOST;
        }
        () = stdin_closed => {}
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    match guard.release().await {
        Ok(()) => 0,
        Err(dlock::Error::NotOwned { .. }) => {
            eprintln!("dlock: lock {} was lost before release", args.name);
            exit::LOST
        }
        Err(e) => fail(&e.into()),
    }
}
