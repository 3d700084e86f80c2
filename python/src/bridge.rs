//! The asyncio bridge: a store call runs as a task on dlock's runtime and the event loop is
//! woken through a socket when it ends; its result becomes a Python object on the loop's own
//! thread.
//!
//! No runtime thread ever touches a Python object or takes the GIL. That is the point of this
//! small bridge over pyo3-async-runtimes, whose threads set results and drop event-loop
//! references themselves: at interpreter exit that raced with finalisation and crashed the
//! process (a reference count dropped after the interpreter was torn down).

use std::future::Future;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::IntoPyObjectExt;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::errors;
use crate::runtime;

/// Makes a finished call's Python result, on the event loop's thread.
type Outcome = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// Wakes one event loop when calls end. `dlock.asyncio` subclasses it (one per loop and
/// process), watches `fileno()` with `loop.add_reader`, and on wake-up takes the finished
/// calls' ids with `take_completed()`.
#[pyclass(module = "dlock._dlock", subclass, frozen)]
pub(crate) struct Notifier {
    read: UnixStream,
    write: Arc<UnixStream>,
    completed: Arc<Mutex<Vec<u64>>>,
    next_id: AtomicU64,
}

#[pymethods]
impl Notifier {
    #[new]
    fn new() -> PyResult<Notifier> {
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        Ok(Notifier {
            read,
            write: Arc::new(write),
            completed: Arc::new(Mutex::new(Vec::new())),
            next_id: AtomicU64::new(1),
        })
    }

    /// The socket to watch for readability.
    fn fileno(&self) -> RawFd {
        self.read.as_raw_fd()
    }

    /// Drains the wake-ups and returns the ids of the calls that ended since the last time.
    fn take_completed(&self) -> Vec<u64> {
        let mut buffer = [0u8; 256];
        loop {
            match (&self.read).read(&mut buffer) {
                Ok(0) => break,
                Ok(_) => {}
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                // WouldBlock: drained.
                Err(_) => break,
            }
        }
        std::mem::take(
            &mut *self
                .completed
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }
}

/// One store call in flight for asyncio.
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct Task {
    /// The id `Notifier.take_completed` reports when the call has ended.
    #[pyo3(get)]
    id: u64,
    outcome: Arc<Mutex<Option<Outcome>>>,
    abort: tokio::task::AbortHandle,
}

#[pymethods]
impl Task {
    /// The call's result, or its exception raised; once, after the call ended.
    fn result(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let outcome = self
            .outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match outcome {
            Some(make) => make(py),
            None => Err(PyRuntimeError::new_err(
                "dlock: the call has not ended, or its result was taken",
            )),
        }
    }

    /// Stops the call (the awaiting task was cancelled). The call's future is dropped on the
    /// runtime, where an abandoned acquisition cleans up after itself; a result that was
    /// already made (a lock acquired at that very moment) is dropped with this task, which
    /// releases it.
    fn abort(&self) {
        self.abort.abort();
    }
}

/// Starts `future` on the runtime and hands its `Task` to `notifier.watch(task)`, which returns
/// the asyncio future to await.
pub(crate) fn start<'py, F, T>(
    notifier: &Bound<'py, Notifier>,
    future: F,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = dlock::Result<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let runtime = runtime::runtime()?;
    let shared = notifier.get();
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let outcome: Arc<Mutex<Option<Outcome>>> = Arc::new(Mutex::new(None));
    let slot = outcome.clone();
    let completed = shared.completed.clone();
    let wake = shared.write.clone();
    let handle = runtime.spawn(async move {
        let result = future.await;
        let make: Outcome = Box::new(move |py| match result {
            Ok(value) => value.into_py_any(py),
            Err(error) => Err(errors::to_py(py, error)),
        });
        *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(make);
        completed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(id);
        // A full socket buffer means a wake-up is already pending: nothing is lost.
        let _ = (&*wake).write(&[1]);
    });
    let task = Task {
        id,
        outcome,
        abort: handle.abort_handle(),
    };
    notifier.call_method1("watch", (task,))
}
