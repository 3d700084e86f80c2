//! The command `dlock run` starts, as a job of its own, the way a shell starts one.
//!
//! - It runs in its own process group, so a lost lock, `--kill-after` and forwarded signals
//!   reach every process it started (`sh -c 'worker & worker & wait'`), not just the first.
//! - On a terminal where dlock is in the foreground, the terminal is handed to that group:
//!   Ctrl-C and Ctrl-Z reach the command directly, and an interactive command can read the
//!   terminal. When the command stops (Ctrl-Z), dlock takes the terminal back and stops too,
//!   so the shell's job control works; `fg` continues both.
//! - A guardian process (`dlock __guard`, in a group of its own) watches a pipe from dlock: if
//!   dlock dies without saying goodbye (SIGKILL, OOM), the lock will expire, so the guardian
//!   signals the whole group with the `--on-lost` signal and SIGKILLs it after `--kill-after`.
//!
//! What no process group can cover: a process that leaves the group on purpose (`setsid`, a
//! daemon's double fork) is not signalled.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::Duration;

use clap::Args;
use nix::sys::signal::{SigHandler, Signal, killpg, signal};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};

/// The running command: its process, its group and what was arranged around it.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) child: tokio::process::Child,
    /// The write end of the guardian's pipe; a byte written to it means "all is well".
    guardian: Option<std::io::PipeWriter>,
    /// Job control: what dlock does when the command stops.
    pub(crate) stops: Stops,
}

/// The command's group and the terminal's owner, and the command's stops (Ctrl-Z) followed on
/// a terminal; a field of its own so that it can be awaited beside the child's exit.
#[derive(Debug)]
pub(crate) struct Stops {
    group: Option<Pid>,
    /// dlock's own group when the terminal was handed to the command's group.
    terminal_from: Option<Pid>,
    child_events: Option<tokio::signal::unix::Signal>,
}

/// The `dlock __guard` arguments (internal: started by `dlock run`, never by users).
#[derive(Debug, Args)]
pub(crate) struct GuardArgs {
    /// The command's process group.
    #[arg(long)]
    group: i32,
    /// The signal to send first (a number).
    #[arg(long)]
    signal: i32,
    /// How long to wait before SIGKILL.
    #[arg(long, value_parser = crate::parse_duration)]
    kill_after: Duration,
}

/// dlock's process group, when stdin is a terminal and dlock runs in its foreground group.
fn foreground_group() -> Option<Pid> {
    let own = getpgrp();
    (tcgetpgrp(std::io::stdin().as_fd()).ok()? == own).then_some(own)
}

/// Hands the terminal to `group`, even from a background process group (SIGTTOU ignored for
/// the call, as shells do).
fn give_terminal(fd: BorrowedFd<'_>, group: Pid) {
    #[allow(unsafe_code)]
    // SAFETY: only the disposition of SIGTTOU changes, and it is restored at once; no handler
    // runs Rust code.
    unsafe {
        let previous = signal(Signal::SIGTTOU, SigHandler::SigIgn);
        let _ = tcsetpgrp(fd, group);
        if let Ok(previous) = previous {
            let _ = signal(Signal::SIGTTOU, previous);
        }
    }
}

impl Job {
    /// Starts `program` with `args` and `envs` in a process group of its own. `on_dlock_death`:
    /// what the guardian sends the group if dlock dies (`None`: no guardian).
    pub(crate) fn spawn(
        program: &OsString,
        args: &[OsString],
        envs: &[(&str, String)],
        on_dlock_death: Option<(Signal, Duration)>,
    ) -> std::io::Result<Job> {
        let terminal = foreground_group();
        let mut command = tokio::process::Command::new(program);
        command.args(args).process_group(0);
        for (key, value) in envs {
            command.env(key, value);
        }
        let hand_over = terminal.is_some();
        #[allow(unsafe_code)]
        // SAFETY: the closure runs in the child between fork and exec and only makes
        // async-signal-safe calls (signal(2), tcsetpgrp(3), getpid(2), prctl(2)); it allocates
        // nothing.
        unsafe {
            command.pre_exec(move || {
                if hand_over {
                    // Take the terminal before exec, so the command never reads it from a
                    // background group; the parent does the same (whichever runs first wins).
                    let previous = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                    libc::tcsetpgrp(0, libc::getpid());
                    libc::signal(libc::SIGTTOU, previous);
                }
                if let Some((signal, _)) = on_dlock_death {
                    die_with_parent(signal)?;
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        let group = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        let mut terminal_from = None;
        if let (Some(own), Some(group)) = (terminal, group) {
            give_terminal(std::io::stdin().as_fd(), group);
            terminal_from = Some(own);
        }
        let guardian = match (on_dlock_death, group) {
            (Some((signal, kill_after)), Some(group)) => {
                Some(start_guardian(group, signal, kill_after)?)
            }
            _ => None,
        };
        let child_events =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()).ok();
        Ok(Job {
            child,
            guardian,
            stops: Stops {
                group,
                terminal_from,
                child_events,
            },
        })
    }

    /// Sends `signal` to every process of the command's group.
    pub(crate) fn signal(&self, signal: Signal) {
        if let Some(group) = self.stops.group {
            let _ = killpg(group, signal);
        }
    }

    /// After the command ended: the terminal back to dlock's group, the guardian told that
    /// all is well.
    pub(crate) fn finish(&mut self) {
        if let (Some(own), Some(group)) = (self.stops.terminal_from.take(), self.stops.group) {
            let stdin = std::io::stdin();
            if tcgetpgrp(stdin.as_fd()).is_ok_and(|fg| fg == group) {
                give_terminal(stdin.as_fd(), own);
            }
        }
        if let Some(mut guardian) = self.guardian.take() {
            let _ = guardian.write_all(b".");
        }
    }
}

impl Stops {
    /// Waits for a child-state change and, if the command was stopped (Ctrl-Z on a terminal),
    /// stops dlock too and continues the command when dlock is continued. Never returns.
    pub(crate) async fn follow(&mut self) {
        let Some(events) = self.child_events.as_mut() else {
            return std::future::pending().await;
        };
        loop {
            events.recv().await;
            let Some(group) = self.group else { continue };
            // WSTOPPED without WEXITED: only a stop is reported (and consumed), so the exit
            // status stays for tokio to collect.
            let stopped = matches!(
                waitid(Id::Pid(group), WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG),
                Ok(WaitStatus::Stopped(..))
            );
            if stopped && let Some(own) = self.terminal_from {
                let stdin = std::io::stdin();
                give_terminal(stdin.as_fd(), own);
                // Stop like the command did; the shell reports the job stopped.
                let _ = nix::sys::signal::raise(Signal::SIGSTOP);
                // Continued (`fg` or `bg`): the command gets the terminal back only if the
                // shell gave dlock the foreground.
                if tcgetpgrp(stdin.as_fd()).is_ok_and(|fg| fg == own) {
                    give_terminal(stdin.as_fd(), group);
                }
                let _ = killpg(group, Signal::SIGCONT);
            }
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Starts `dlock __guard` for `group`, in a process group of its own so that signals meant for
/// dlock's job do not reach it.
fn start_guardian(
    group: Pid,
    signal: Signal,
    kill_after: Duration,
) -> std::io::Result<std::io::PipeWriter> {
    let (reader, writer) = std::io::pipe()?;
    std::process::Command::new(std::env::current_exe()?)
        .arg("__guard")
        .arg("--group")
        .arg(group.as_raw().to_string())
        .arg("--signal")
        .arg((signal as i32).to_string())
        .arg("--kill-after")
        .arg(format!("{}ms", kill_after.as_millis()))
        .stdin(reader)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .process_group(0)
        .env_remove("DLOCK_URL")
        .spawn()?;
    Ok(writer)
}

/// `dlock __guard`: waits for dlock's goodbye on stdin; at end of file without one, dlock
/// died while its command ran, so the command's group is signalled.
pub(crate) fn guard(args: &GuardArgs) -> i32 {
    let mut byte = [0u8; 1];
    loop {
        match std::io::stdin().read(&mut byte) {
            Ok(1) => return 0,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
    let group = Pid::from_raw(args.group);
    let Ok(signal) = Signal::try_from(args.signal) else {
        return 1;
    };
    if killpg(group, signal).is_err() {
        return 0; // the group is gone already
    }
    eprintln!(
        "dlock: dlock ended while its command ran (its lock expires with its lease); sent {signal} to the command's processes"
    );
    if signal == Signal::SIGKILL {
        return 0;
    }
    let deadline = std::time::Instant::now() + args.kill_after;
    while std::time::Instant::now() < deadline {
        if killpg(group, None).is_err() {
            return 0;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if killpg(group, Signal::SIGKILL).is_ok() {
        eprintln!("dlock: the command's processes still ran; sent SIGKILL");
    }
    0
}

/// Has the kernel send `signal` to the command when dlock exits, whatever the cause (the
/// guardian covers the rest of the group).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn die_with_parent(signal: Signal) -> std::io::Result<()> {
    // The parent is dlock's main thread, which lives as long as dlock (PR_SET_PDEATHSIG
    // follows the spawning thread).
    nix::sys::prctl::set_pdeathsig(signal).map_err(std::io::Error::from)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn die_with_parent(_signal: Signal) -> std::io::Result<()> {
    Ok(())
}
