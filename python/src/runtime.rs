//! The tokio runtime every store call of this process runs on, and the two ways Python reaches
//! it: [`block`] (a synchronous call that releases the GIL and stays interruptible by Ctrl-C)
//! and the asyncio bridge (`bridge::start`).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tokio::runtime::Runtime;

/// How long a synchronous call waits with the GIL released before it looks for a pending
/// signal: Ctrl-C interrupts a blocking acquire within this time.
const SIGNAL_SLICE: Duration = Duration::from_millis(50);

/// The runtime of the process that built it. After `fork()` the child has the parent's memory
/// but none of its threads, so a runtime whose pid is not ours is dead: it is leaked (dropping
/// it would wait for worker threads that do not exist here) and a new one is built.
struct Current {
    pid: u32,
    runtime: Arc<Runtime>,
}

static CURRENT: Mutex<Option<Current>> = Mutex::new(None);

/// The runtime of this process, built on first use (and again in a forked child).
///
/// Called with the GIL held, so no other Python thread is inside it when Python forks; the
/// runtime's own threads never call it.
pub(crate) fn runtime() -> PyResult<Arc<Runtime>> {
    let pid = std::process::id();
    let mut current = CURRENT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(existing) = current.as_ref()
        && existing.pid == pid
    {
        return Ok(existing.runtime.clone());
    }
    if let Some(stale) = current.take() {
        std::mem::forget(stale);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("dlock-runtime")
        .build()
        .map_err(|error| {
            PyRuntimeError::new_err(format!("dlock: cannot start its runtime: {error}"))
        })?;
    let runtime = Arc::new(runtime);
    *current = Some(Current {
        pid,
        runtime: runtime.clone(),
    });
    Ok(runtime)
}

/// Whether `pid` is this process: objects made before a fork answer "not owned" in the child.
pub(crate) fn is_this_process(pid: u32) -> bool {
    pid == std::process::id()
}

/// Runs `future` to completion on the runtime from a Python thread: the GIL is released while it
/// runs, and every [`SIGNAL_SLICE`] Python's signal handlers get their turn. A handler that
/// raises (Ctrl-C's `KeyboardInterrupt`) drops the future, which every dlock operation allows
/// (an acquisition dropped half-way never leaves a lock held past its lease), and the exception
/// propagates.
pub(crate) fn block<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    block_flushed(py, future, None)
}

/// A store call made after an abandoned acquisition to be sure its clean-up ran: stores that
/// queue their clean-up on a worker of their own (SQLite) run it before any later call.
pub(crate) type Flush = Pin<Box<dyn Future<Output = ()> + Send>>;

/// [`block`], with `flush` run (bounded) when the call is interrupted.
pub(crate) fn block_flushed<F>(
    py: Python<'_>,
    future: F,
    mut flush: Option<Flush>,
) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let runtime = runtime()?;
    let mut future = Box::pin(future);
    loop {
        // The future runs on this thread, which may then do its store I/O blocking (Redis: no
        // hop to a runtime thread and back per command); a blocking command delays Ctrl-C by
        // at most the store's response timeout.
        let step = py.detach(|| {
            dlock::blocking::as_blocking_caller(|| {
                runtime
                    .block_on(async { tokio::time::timeout(SIGNAL_SLICE, future.as_mut()).await })
            })
        });
        match step {
            Ok(output) => return Ok(output),
            Err(_slice_over) => {
                if let Err(interrupted) = py.check_signals() {
                    abandon(py, &runtime, future, flush.take());
                    return Err(interrupted);
                }
            }
        }
    }
}

/// How long an interrupted call waits for the clean-up its future spawned when dropped.
const CLEANUP_GRACE: Duration = Duration::from_secs(1);

/// Drops an interrupted call's future and lets its clean-up finish. An abandoned wait spawns
/// its clean-up (leaving the waiters' queue, releasing a lease taken at that very moment) on
/// the current runtime: dropped outside the runtime it would skip it, and a process that exits
/// on Ctrl-C right after would kill it half-way, leaving a dead place at the head of the queue
/// until it expires. The wait is bounded and has the GIL released.
fn abandon<F: Future + ?Sized>(
    py: Python<'_>,
    runtime: &Runtime,
    future: Pin<Box<F>>,
    flush: Option<Flush>,
) {
    let before = runtime.metrics().num_alive_tasks();
    {
        let _context = runtime.enter();
        drop(future);
    }
    py.detach(|| {
        runtime.block_on(async {
            let deadline = tokio::time::Instant::now() + CLEANUP_GRACE;
            while runtime.metrics().num_alive_tasks() > before
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            if let Some(flush) = flush {
                let _ = tokio::time::timeout_at(deadline, flush).await;
            }
        })
    });
}
