//! `dlock run NAME -- CMD ARGS...`: hold a lock while a command runs.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, SystemTime};

use clap::{Args, ValueEnum};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};

use crate::{WaitArgs, connect, exit, fail, parse_duration};

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The lock's name.
    name: String,

    /// Lease length, renewed by the watchdog while the command runs (default 30s). If dlock is
    /// killed, the lock frees up within this.
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<Duration>,

    #[command(flatten)]
    wait: WaitArgs,

    /// Queue fairly: waiters get the lock in arrival order, across processes.
    #[arg(long)]
    fair: bool,

    /// Stop renewing after this long: past it the lock expires and the command is signalled
    /// as if the lock were lost.
    #[arg(long, value_parser = parse_duration)]
    max_hold: Option<Duration>,

    /// What to do to the command if the lock is lost while it runs.
    #[arg(long, value_enum, default_value_t = OnLost::Term)]
    on_lost: OnLost,

    /// Do not show who holds the lock while waiting, even on a terminal.
    #[arg(long, short)]
    quiet: bool,

    /// The command to run (after `--`); it gets DLOCK_FENCE and DLOCK_NAME in its environment.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// What to send the command when the lock is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OnLost {
    /// SIGTERM.
    Term,
    /// SIGINT.
    Int,
    /// SIGKILL.
    Kill,
    /// Nothing: let it finish; dlock still reports the loss and exits 76 if it succeeds.
    Ignore,
}

impl OnLost {
    fn signal(self) -> Option<Signal> {
        match self {
            OnLost::Term => Some(Signal::SIGTERM),
            OnLost::Int => Some(Signal::SIGINT),
            OnLost::Kill => Some(Signal::SIGKILL),
            OnLost::Ignore => None,
        }
    }
}

fn label_for(command: &[OsString]) -> Option<String> {
    let program = command.first()?;
    let base = std::path::Path::new(program).file_name()?.to_string_lossy();
    Some(format!("dlock run {base}"))
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
                "\r\x1b[2Kdlock: waiting for {name}: held by {} for {held}{ttl}",
                info.owner
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub(crate) async fn run(url: &str, label: Option<String>, args: RunArgs) -> i32 {
    let label = label.or_else(|| label_for(&args.command));
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
    if let Some(max) = args.max_hold {
        builder = builder.max_hold(max);
    }
    let status = (!args.quiet && !args.wait.no_wait && std::io::stderr().is_terminal())
        .then(|| tokio::spawn(show_holder(locks.clone(), args.name.clone())));
    let acquired = builder.acquire().await;
    if let Some(status) = status {
        status.abort();
        eprint!("\r\x1b[2K");
    }
    let guard = match acquired {
        Ok(guard) => guard,
        Err(dlock::Error::Timeout { waited, .. }) if waited.is_zero() => {
            let holder = match locks.inspect(&args.name).await {
                Ok(Some(info)) => format!(" by {}", info.owner),
                _ => String::new(),
            };
            eprintln!("dlock: {} is held{holder}", args.name);
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
    let fence = guard.fence();
    let (program, rest) = match args.command.split_first() {
        Some(split) => split,
        None => return fail(&anyhow::anyhow!("no command given")),
    };
    let spawned = tokio::process::Command::new(program)
        .args(rest)
        .env("DLOCK_FENCE", fence.to_string())
        .env("DLOCK_NAME", &args.name)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let _ = guard.release().await;
            eprintln!("dlock: cannot run {}: {e}", program.to_string_lossy());
            return match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::NOT_EXECUTABLE,
            };
        }
    };
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let forward = |sig: Signal| {
        if let Some(pid) = pid {
            let _ = kill(pid, sig);
        }
    };
    let signals = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    );
    let (mut term, mut int, mut hup) = match signals {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return fail(&e.into()),
    };
    let mut lost = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            () = guard.lost(), if !lost => {
                lost = true;
                match args.on_lost.signal() {
                    Some(sig) => {
                        eprintln!("dlock: lock {} (fence {fence}) was lost while the command ran; sending {sig}", args.name);
                        forward(sig);
                    }
                    None => eprintln!("dlock: lock {} (fence {fence}) was lost while the command ran", args.name),
                }
            }
            _ = term.recv() => forward(Signal::SIGTERM),
            _ = int.recv() => forward(Signal::SIGINT),
            _ = hup.recv() => forward(Signal::SIGHUP),
        }
    };
    let code = match status {
        Ok(status) => status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(exit::FAILED),
        Err(e) => {
            eprintln!("dlock: waiting for the command failed: {e}");
            exit::FAILED
        }
    };
    if !lost {
        match guard.release().await {
            Ok(()) => {}
            Err(dlock::Error::NotOwned { .. }) => {
                eprintln!(
                    "dlock: lock {} was lost before the command finished",
                    args.name
                );
                lost = true;
            }
            Err(e) => eprintln!("dlock: release failed ({e}); the lock expires with its lease"),
        }
    }
    if lost && code == 0 { exit::LOST } else { code }
}
