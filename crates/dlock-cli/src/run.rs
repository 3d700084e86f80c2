//! `dlock run NAME -- CMD ARGS...`: hold a lock while a command runs.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;

use clap::{Args, ValueEnum};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::signals::{self, Signals};
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
            eprintln!("dlock: {sig} while waiting for {name}; the command was not run");
            return signals::exit_code(sig);
        }
    };
    let fence = guard.fence();
    let (program, rest) = match args.command.split_first() {
        Some(split) => split,
        None => return fail(&anyhow::anyhow!("no command given")),
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(rest)
        .env("DLOCK_FENCE", fence.to_string())
        .env("DLOCK_NAME", name);
    if let Some(sig) = args.on_lost.signal() {
        // If dlock itself dies (SIGKILL, OOM), its lock expires: treat that as a loss too.
        die_with_parent(&mut command, sig);
    }
    let spawned = command.spawn();
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
            sig = signals.recv() => forward(sig),
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

/// Has the kernel send `signal` to the command when dlock exits, whatever the cause.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[allow(unsafe_code)]
fn die_with_parent(command: &mut tokio::process::Command, signal: Signal) {
    // SAFETY: the closure runs in the child between fork and exec; it only calls prctl(2),
    // which is async-signal-safe, and allocates nothing. The parent is the main thread, which
    // lives as long as dlock (PR_SET_PDEATHSIG follows the spawning thread).
    unsafe {
        command
            .pre_exec(move || nix::sys::prctl::set_pdeathsig(signal).map_err(std::io::Error::from));
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn die_with_parent(_command: &mut tokio::process::Command, _signal: Signal) {}
