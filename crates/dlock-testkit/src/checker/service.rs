//! The fenced resource as a service on a loopback TCP port, so that lock holders in other
//! processes write through it and the test process sees every hold and every write.
//!
//! One line per request, one line per reply (`OK`, `STALE <highest>`, `GO`, `STOP`):
//!
//! | request | meaning |
//! |---|---|
//! | `ATTEMPT <pid>` | about to acquire; the reply `STOP` tells the worker to finish |
//! | `TIMEOUT <pid>` / `ERROR <pid> <message>` | the acquire timed out / failed otherwise (indeterminate) |
//! | `BEGIN <pid> <fence> [w\|r\|p [<fence>…\|s<slot>]]` | the acquire returned this fence: a hold starts (exclusive, read or permit; exclusive when absent); a multi-lock adds the fences of its other names, in order, and its `LOST` and `END` name the first; a composed semaphore's permit adds its slot's number |
//! | `WRITE <pid> <fence>` | a write through the fence: `OK` or `STALE <highest>` |
//! | `READ <pid> <fence>` | a reader's read: `OK` or `STALE <highest>` (refused like a write, raises nothing) |
//! | `LOST <pid> <fence>` | the guard's lost signal fired |
//! | `END <pid> <fence>` | the holder is about to release: the hold ends |
//!
//! Every time is taken here, on receipt, with the test process's monotonic clock
//! (`CLOCK_MONOTONIC`, the one every process of the machine shares): a hold starts after its
//! acquire returned and ends before its release is sent, so recorded holds lie inside the
//! real ones.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock::FencingToken;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::{FencedResource, HoldKind};

/// How the workers' acquisitions went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Acquisitions {
    /// Acquires started.
    pub attempted: usize,
    /// Acquires that returned a guard.
    pub succeeded: usize,
    /// Acquires that ran out of wait ([`dlock::Error::Timeout`]).
    pub timed_out: usize,
    /// Acquires that failed otherwise (store unreachable, session lost…): the caller cannot
    /// tell whether the lock was granted.
    pub indeterminate: usize,
}

/// A holder frozen by the service (SIGSTOP right after it reported its hold).
#[derive(Clone, Copy, Debug)]
pub struct Pause {
    /// The paused process.
    pub pid: u32,
    /// The fence it held.
    pub fence: FencingToken,
    /// When it was stopped.
    pub stopped: Instant,
    /// When it was continued, once it was.
    pub continued: Option<Instant>,
}

#[derive(Debug, Default)]
struct Shared {
    resource: FencedResource,
    acquisitions: Mutex<Acquisitions>,
    errors: Mutex<Vec<String>>,
    stop: AtomicBool,
    pause_request: Mutex<Option<Duration>>,
    pauses: Mutex<Vec<Pause>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The fenced resource served on `127.0.0.1:<free port>`, on a thread of its own (usable from
/// synchronous and asynchronous tests alike). Stopped on drop.
///
/// ```no_run
/// use dlock_testkit::checker::{FencedResource, service::CheckerService};
///
/// let service = CheckerService::start(FencedResource::new())?;
/// // Workers get `service.addr()` (see `checker::worker`) and write through it…
/// service.stop_workers();
/// assert!(service.resource().report().overlaps.is_empty());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct CheckerService {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CheckerService {
    /// Serves `resource` on a free loopback port.
    ///
    /// # Errors
    ///
    /// The runtime or the listener could not be made.
    pub fn start(resource: FencedResource) -> io::Result<CheckerService> {
        // Bound here, with std, so `start` also works from inside a runtime.
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let shared = Arc::new(Shared {
            resource,
            ..Shared::default()
        });
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel();
        let serving = shared.clone();
        let thread = std::thread::Builder::new()
            .name("checker-service".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    tokio::select! {
                        _ = shutdown_rx => {}
                        () = serve(listener, serving) => {}
                    }
                });
            })?;
        Ok(CheckerService {
            addr,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// Where workers connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The record.
    pub fn resource(&self) -> &FencedResource {
        &self.shared.resource
    }

    /// The acquisitions so far.
    pub fn acquisitions(&self) -> Acquisitions {
        *lock(&self.shared.acquisitions)
    }

    /// The first indeterminate acquire errors the workers reported (at most 20).
    pub fn errors(&self) -> Vec<String> {
        lock(&self.shared.errors).clone()
    }

    /// Answers `STOP` to every further `ATTEMPT`: workers finish their hold and exit.
    pub fn stop_workers(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }

    /// Freezes the next worker that reports a hold (SIGSTOP before the service answers its
    /// `BEGIN`, so it is frozen while it holds the lock and before its first write) and
    /// continues it (SIGCONT) after `pause`.
    pub fn pause_next_holder(&self, pause: Duration) {
        *lock(&self.shared.pause_request) = Some(pause);
    }

    /// The holders frozen so far.
    pub fn pauses(&self) -> Vec<Pause> {
        lock(&self.shared.pauses).clone()
    }
}

impl Drop for CheckerService {
    fn drop(&mut self) {
        // A worker left frozen would outlive the test.
        for pause in self.pauses() {
            if pause.continued.is_none() {
                let _ = kill(pid_of(pause.pid), Signal::SIGCONT);
            }
        }
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX))
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(connection(stream, shared.clone()));
    }
}

async fn connection(stream: TcpStream, shared: Arc<Shared>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = handle(&line, &shared);
        if write
            .write_all(format!("{reply}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

fn handle(line: &str, shared: &Arc<Shared>) -> String {
    let mut parts = line.splitn(3, ' ');
    let (verb, pid, rest) = (
        parts.next().unwrap_or_default(),
        parts.next().and_then(|p| p.parse::<u32>().ok()),
        parts.next().unwrap_or_default(),
    );
    let Some(pid) = pid else {
        return format!("ERR bad request {line:?}");
    };
    let (fence, kind, other_fences, slot) = words_of(rest);
    let resource = &shared.resource;
    match (verb, fence) {
        ("ATTEMPT", _) => {
            if shared.stop.load(Ordering::SeqCst) {
                return "STOP".into();
            }
            lock(&shared.acquisitions).attempted += 1;
            resource.attempt(pid);
            "GO".into()
        }
        ("TIMEOUT", _) => {
            lock(&shared.acquisitions).timed_out += 1;
            "OK".into()
        }
        ("ERROR", _) => {
            lock(&shared.acquisitions).indeterminate += 1;
            let mut errors = lock(&shared.errors);
            if errors.len() < 20 {
                errors.push(rest.to_owned());
            }
            "OK".into()
        }
        ("BEGIN", Some(fence)) => {
            let Some(other_fences) = other_fences else {
                return format!("ERR bad request {line:?}");
            };
            lock(&shared.acquisitions).succeeded += 1;
            match slot {
                Some(slot) if kind == HoldKind::Permit => {
                    resource.begin_on_slot(fence, slot, Some(pid));
                }
                _ => {
                    let fences: Vec<FencingToken> =
                        std::iter::once(fence).chain(other_fences).collect();
                    resource.begin_parts(&fences, kind, Some(pid));
                }
            }
            if let Some(pause) = lock(&shared.pause_request).take() {
                freeze(shared, pid, fence, pause);
            }
            "OK".into()
        }
        ("WRITE", Some(fence)) => match resource.write(fence) {
            Ok(()) => "OK".into(),
            Err(stale) => format!("STALE {}", stale.highest.get()),
        },
        ("READ", Some(fence)) => match resource.read(fence) {
            Ok(()) => "OK".into(),
            Err(stale) => format!("STALE {}", stale.highest.get()),
        },
        ("LOST", Some(fence)) => {
            resource.hold_lost_of(fence, Some(pid));
            "OK".into()
        }
        ("END", Some(fence)) => {
            resource.end_hold_of(fence, Some(pid));
            "OK".into()
        }
        _ => format!("ERR bad request {line:?}"),
    }
}

/// A request's words after its pid: `<fence> [w|r|p [<fence>…|s<slot>]]` (`BEGIN`'s, the
/// others have only the fence): the fence, what the hold excludes (exclusive when absent), a
/// multi-lock's other names' fences (`None` if one is not a number) and a composed permit's
/// slot.
fn words_of(
    rest: &str,
) -> (
    Option<FencingToken>,
    HoldKind,
    Option<Vec<FencingToken>>,
    Option<u32>,
) {
    let mut words = rest.split(' ');
    let fence = words
        .next()
        .and_then(|fence| fence.parse::<u64>().ok())
        .map(FencingToken::new);
    let kind = words
        .next()
        .and_then(HoldKind::from_letter)
        .unwrap_or_default();
    let (slots, others): (Vec<&str>, Vec<&str>) = words.partition(|word| word.starts_with('s'));
    let slot = slots
        .first()
        .and_then(|word| word.strip_prefix('s'))
        .and_then(|number| number.parse::<u32>().ok());
    let other_fences = others
        .into_iter()
        .map(|word| word.parse::<u64>().ok().map(FencingToken::new))
        .collect();
    (fence, kind, other_fences, slot)
}

fn freeze(shared: &Arc<Shared>, pid: u32, fence: FencingToken, pause: Duration) {
    if kill(pid_of(pid), Signal::SIGSTOP).is_err() {
        return;
    }
    let index = {
        let mut pauses = lock(&shared.pauses);
        pauses.push(Pause {
            pid,
            fence,
            stopped: Instant::now(),
            continued: None,
        });
        pauses.len() - 1
    };
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(pause).await;
        let _ = kill(pid_of(pid), Signal::SIGCONT);
        lock(&shared.pauses)[index].continued = Some(Instant::now());
    });
}
