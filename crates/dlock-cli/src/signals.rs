//! The signals `run` and `hold` handle. They are registered before anything else happens, so a
//! signal during start-up is handled (forwarded, or ends the wait) instead of killing dlock
//! with its command left running.

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

/// SIGTERM, SIGINT and SIGHUP, received as a stream.
#[derive(Debug)]
pub(crate) struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal received.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// The exit code of a process ended by `signal`, as shells report it.
pub(crate) fn exit_code(signal: Signal) -> i32 {
    128 + signal as i32
}
