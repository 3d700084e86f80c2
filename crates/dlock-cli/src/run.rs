//! `dlock run NAME -- CMD ARGS...`: hold a lock while a command runs.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;

use clap::{Args, ValueEnum};
use nix::sys::signal::Signal;

use crate::job::Job;
use crate::shown::shown;
use crate::signals::{self, Signals};
use crate::take::{Held, LockArgs, take};
use crate::{exit, fail};

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    lock: LockArgs,

    /// What to do to the command if the lock is lost while it runs (also sent if dlock dies).
    #[arg(long, value_enum, default_value_t = OnLost::Term)]
    on_lost: OnLost,

    /// After the --on-lost signal, SIGKILL the command if it still runs this much later.
    #[arg(long, value_parser = crate::parse_duration, allow_hyphen_values = true, default_value = "10s")]
    kill_after: std::time::Duration,

    /// The command to run (after `--`); it gets DLOCK_FENCE and DLOCK_NAME in its environment.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// What happened while the command ran.
enum Event {
    Exited(std::io::Result<std::process::ExitStatus>),
    Lost,
    Escalate,
    Signal(Signal),
}

/// What to send the command when the lock is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnLost {
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
    pub(crate) fn signal(self) -> Option<Signal> {
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

pub(crate) async fn run(url: &str, label: Option<String>, args: RunArgs) -> i32 {
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => return fail(&e.into()),
    };
    let label = label.or_else(|| label_for(&args.command));
    let name = args.lock.name.as_str();
    let guard = tokio::select! {
        taken = take(url, label, &args.lock) => match taken {
            Ok(guard) => guard,
            Err(code) => return code,
        },
        sig = signals.recv() => {
            eprintln!("dlock: {sig} while waiting for {}; the command was not run", shown(name));
            return signals::exit_code(sig);
        }
    };
    let what = Supervised {
        name,
        on_lost: args.on_lost,
        kill_after: args.kill_after,
        command: &args.command,
        envs: Vec::new(),
        lost_exit: args.lock.lost_exit.into(),
    };
    supervise(guard, what, signals).await
}

/// What `supervise` runs, and how it treats a loss.
pub(crate) struct Supervised<'a> {
    pub(crate) name: &'a str,
    pub(crate) on_lost: OnLost,
    pub(crate) kill_after: std::time::Duration,
    pub(crate) command: &'a [OsString],
    /// Environment beyond DLOCK_FENCE and DLOCK_NAME.
    pub(crate) envs: Vec<(&'static str, String)>,
    /// The exit code of a command that succeeded after the hold was lost.
    pub(crate) lost_exit: i32,
}

/// Reports a command that could not be started; its exit code.
fn not_run(program: &OsString, e: &std::io::Error) -> i32 {
    eprintln!(
        "dlock: cannot run {}: {e}",
        shown(&program.to_string_lossy())
    );
    match e.kind() {
        std::io::ErrorKind::NotFound => exit::NOT_FOUND,
        _ => exit::NOT_EXECUTABLE,
    }
}

/// Runs the command while `guard` holds, stopping its process group on loss (`run`, `elect`);
/// releases the hold after and returns the exit code.
pub(crate) async fn supervise(guard: Held, what: Supervised<'_>, mut signals: Signals) -> i32 {
    let Supervised {
        name,
        on_lost,
        kill_after,
        command,
        envs: extra,
        lost_exit,
    } = what;
    let fence = guard.fence();
    let shown_name = shown(name);
    let (program, rest) = match command.split_first() {
        Some(split) => split,
        None => return fail(&anyhow::anyhow!("no command given")),
    };
    let mut envs = vec![
        ("DLOCK_FENCE", fence.to_string()),
        ("DLOCK_NAME", name.to_owned()),
    ];
    envs.extend(extra);
    // If dlock itself dies (SIGKILL, OOM), its lock expires: treat that as a loss too.
    let on_dlock_death = on_lost.signal().map(|sig| (sig, kill_after));
    let mut job = match Job::spawn(program, rest, &envs, on_dlock_death) {
        Ok(job) => job,
        Err(e) => {
            let _ = guard.release().await;
            return not_run(program, &e);
        }
    };
    let mut lost = false;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let status = loop {
        let escalate = async {
            match kill_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let event = tokio::select! {
            status = job.child.wait() => Event::Exited(status),
            () = guard.lost(), if !lost => Event::Lost,
            () = escalate => Event::Escalate,
            sig = signals.recv() => Event::Signal(sig),
            () = job.stops.follow() => continue,
        };
        match event {
            Event::Exited(status) => break status,
            Event::Lost => {
                lost = true;
                match on_lost.signal() {
                    Some(sig) => {
                        eprintln!(
                            "dlock: lock {shown_name} (fence {fence}) was lost while the command ran; sending {sig}"
                        );
                        job.signal(sig);
                        if sig != Signal::SIGKILL {
                            kill_at = Some(tokio::time::Instant::now() + kill_after);
                        }
                    }
                    None => eprintln!(
                        "dlock: lock {shown_name} (fence {fence}) was lost while the command ran"
                    ),
                }
            }
            Event::Escalate => {
                eprintln!(
                    "dlock: the command still runs {} after losing the lock; sending SIGKILL",
                    humantime::format_duration(kill_after)
                );
                job.signal(Signal::SIGKILL);
                kill_at = None;
            }
            // The command has a process group of its own (and the terminal, if dlock had it),
            // so a signal dlock receives is meant for the whole command.
            Event::Signal(sig) => job.signal(sig),
        }
    };
    job.finish();
    let code = settle(guard, status, lost, &shown_name).await;
    match code {
        Settled::Lost => lost_exit,
        Settled::Code(code) => code,
    }
}

/// How a command's run ended for its exit code.
enum Settled {
    /// It succeeded, but the hold was lost first: the lost exit code (76 by default).
    Lost,
    /// Its own exit code, or dlock's for a wait that failed.
    Code(i32),
}

/// How the run ended once the command did: its own code, or a success after a loss (found
/// now by the release, if not told before).
async fn settle(
    guard: Held,
    status: std::io::Result<std::process::ExitStatus>,
    mut lost: bool,
    shown_name: &str,
) -> Settled {
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
                eprintln!("dlock: lock {shown_name} was lost before the command finished");
                lost = true;
            }
            Err(e) => eprintln!("dlock: release failed ({e}); the lock expires with its lease"),
        }
    }
    if lost && code == 0 {
        Settled::Lost
    } else {
        Settled::Code(code)
    }
}
