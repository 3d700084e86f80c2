//! The asyncio bridge: a store call runs as a task on dlock's runtime and the event loop is
//! woken through a socket when it ends; its result becomes a Python object on the loop's own
//! thread. A call that needs Python code while it runs (an update's callback) asks the loop
//! the same way, and waits for the answer ([`Asker`]).
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
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use pyo3::IntoPyObjectExt;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors;
use crate::runtime;

/// Makes a finished call's Python result, on the event loop's thread.
type Outcome = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// Wakes one event loop when calls end or ask something. `dlock.asyncio` subclasses it (one
/// per loop and process), watches `fileno()` with `loop.add_reader`, and on wake-up takes the
/// finished calls' ids with `take_completed()` and answers `take_asks()`.
#[pyclass(module = "dlock._dlock", subclass, frozen)]
pub(crate) struct Notifier {
    read: UnixStream,
    write: Arc<UnixStream>,
    completed: Arc<Mutex<Vec<u64>>>,
    /// The only strong reference: when the notifier goes (its loop closed), the questions
    /// nobody will answer go with it, and the calls waiting on them go on without an answer.
    questions: Arc<Mutex<Vec<Question>>>,
    next_id: AtomicU64,
}

/// What a call asks the loop's thread: the bytes its Python callback makes of `current`.
struct Question {
    task: u64,
    current: Option<Vec<u8>>,
    reply: SyncSender<Option<Vec<u8>>>,
}

/// How a call running on the runtime asks the event loop's thread for a Python callback's
/// result (`Notifier.watch(task, answerer)` names the callback).
pub(crate) struct Asker {
    task: u64,
    questions: Weak<Mutex<Vec<Question>>>,
    wake: Arc<UnixStream>,
}

impl Asker {
    /// The answerer's result for `current`, or `None` (decline) when nobody will answer: the
    /// awaiting task was cancelled or its loop is gone. Blocks this runtime thread until the
    /// loop answers (tokio moves its other tasks elsewhere meanwhile): the callback is Python
    /// code, which runs on the loop's thread and nowhere else.
    pub(crate) fn ask(&self, current: Option<&[u8]>) -> Option<Vec<u8>> {
        let (reply, answer) = sync_channel(1);
        {
            // Not kept while waiting: the notifier's drop must be able to drop the question.
            let questions = self.questions.upgrade()?;
            questions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Question {
                    task: self.task,
                    current: current.map(<[u8]>::to_vec),
                    reply,
                });
        }
        // A full socket buffer means a wake-up is already pending: nothing is lost.
        let _ = (&*self.wake).write(&[1]);
        // A reply dropped unanswered (the `Ask` dropped, the notifier gone) declines.
        tokio::task::block_in_place(|| answer.recv().ok().flatten())
    }
}

/// One question of a running call, for the loop's thread to answer.
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct Ask {
    /// The id of the asking call's `Task`.
    #[pyo3(get)]
    task: u64,
    current: Option<Vec<u8>>,
    reply: Mutex<Option<SyncSender<Option<Vec<u8>>>>>,
}

#[pymethods]
impl Ask {
    /// The value the call read (`None`: never written).
    #[getter]
    fn current<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.current.as_deref().map(|c| PyBytes::new(py, c))
    }

    /// Hands `value` to the waiting call, once (`None` declines); later answers are ignored.
    fn answer(&self, value: Option<Bound<'_, PyBytes>>) {
        let reply = self
            .reply
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(reply) = reply {
            // The call may be gone (aborted): then nobody needs the answer.
            let _ = reply.send(value.map(|v| v.as_bytes().to_vec()));
        }
    }
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
            questions: Arc::new(Mutex::new(Vec::new())),
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

    /// The questions of running calls since the last time; take them after `take_completed()`
    /// (which drains the wake-ups), so none waits for another wake-up.
    fn take_asks(&self) -> Vec<Ask> {
        let questions = std::mem::take(
            &mut *self
                .questions
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        questions
            .into_iter()
            .map(|q| Ask {
                task: q.task,
                current: q.current,
                reply: Mutex::new(Some(q.reply)),
            })
            .collect()
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
    spawn(notifier, |_| future, None)
}

/// [`start`] for a call that runs Python code while it runs: `call` gets the [`Asker`] of the
/// new task, and `notifier.watch(task, answerer)` the Python callable that answers its
/// questions on the loop's thread.
pub(crate) fn start_asking<'py, C, F, T>(
    notifier: &Bound<'py, Notifier>,
    answerer: Bound<'py, PyAny>,
    call: C,
) -> PyResult<Bound<'py, PyAny>>
where
    C: FnOnce(Asker) -> F,
    F: Future<Output = dlock::Result<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let shared = notifier.get();
    let (questions, wake) = (Arc::downgrade(&shared.questions), shared.write.clone());
    spawn(
        notifier,
        |task| {
            call(Asker {
                task,
                questions,
                wake,
            })
        },
        Some(answerer),
    )
}

fn spawn<'py, C, F, T>(
    notifier: &Bound<'py, Notifier>,
    call: C,
    answerer: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>>
where
    C: FnOnce(u64) -> F,
    F: Future<Output = dlock::Result<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let runtime = runtime::runtime()?;
    let shared = notifier.get();
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let future = call(id);
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
    match answerer {
        None => notifier.call_method1("watch", (task,)),
        Some(answerer) => notifier.call_method1("watch", (task, answerer)),
    }
}
