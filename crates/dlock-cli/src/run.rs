//! `dlock run NAME -- CMD ARGS...`: hold a lock while a command runs.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;

use clap::{Args, ValueEnum};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};

use crate::take::{LockArgs, take};
use crate::{exit, fail};

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    lock: LockArgs,

    /// What to do to the command if the lock is lost while it runs.
    #[arg(long, value_enum, default_value_t = OnLost::Term)]
    on_lost: OnLost,

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

pub(crate) async fn run(url: &str, label: Option<String>, args: RunArgs) -> i32 {
    let label = label.or_else(|| label_for(&args.command));
    let guard = match take(url, label, &args.lock).await {
        Ok(guard) => guard,
        Err(code) => return code,
    };
    let name = args.lock.name.as_str();
    let fence = guard.fence();
    let (program, rest) = match args.command.split_first() {
        Some(split) => split,
        None => return fail(&anyhow::anyhow!("no command given")),
    };
    let spawned = tokio::process::Command::new(program)
        .args(rest)
        .env("DLOCK_FENCE", fence.to_string())
        .env("DLOCK_NAME", name)
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
                        eprintln!("dlock: lock {} (fence {fence}) was lost while the command ran; sending {sig}", name);
                        forward(sig);
                    }
                    None => eprintln!("dlock: lock {} (fence {fence}) was lost while the command ran", name),
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
                eprintln!("dlock: lock {} was lost before the command finished", name);
                lost = true;
            }
            Err(e) => eprintln!("dlock: release failed ({e}); the lock expires with its lease"),
        }
    }
    if lost && code == 0 { exit::LOST } else { code }
}
