//! `dlock._dlock`: the native half of the `dlock` Python package.
//!
//! Everything here is a thin bridge to the Rust crate: a [`Client`] per `dlock.connect(url)`,
//! a [`hold::Hold`] per acquisition, store calls run on one tokio runtime per process. The
//! redis-py semantics (thread-local tokens, `True`/`False` returns, which error where) live in
//! the Python modules beside this crate, so the sync and asyncio APIs share them.
//!
//! Every store method takes `aio`: without it the call runs to completion with the GIL released
//! ([`runtime::block`]); with a [`bridge::Notifier`] it returns an asyncio future
//! ([`bridge::start`]).

use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures::TryStreamExt;
use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

mod barrier;
mod bridge;
mod convert;
mod coordination;
mod election;
mod errors;
mod hold;
mod runtime;

use bridge::Notifier;
use convert::{Bytes, WaitFor, configure, info_tuple, seconds, versioned, written_bytes};
use hold::{Hold, timed_out_is_none};

/// Runs a store call the way the caller asked: to completion (GIL released, Ctrl-C honoured)
/// or as an asyncio awaitable.
pub(crate) fn run<'py, F, T>(
    py: Python<'py>,
    aio: Option<Bound<'py, Notifier>>,
    future: F,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = dlock::Result<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    run_flushed(py, aio, future, None)
}

/// [`run`] for an acquisition: if Ctrl-C interrupts it, `flush` makes sure the store's
/// clean-up of the abandoned wait has run before the exception reaches Python (a process that
/// exits right after would otherwise leave a dead place in the waiters' queue).
fn run_acquire<'py, F, T>(
    py: Python<'py>,
    aio: Option<Bound<'py, Notifier>>,
    locks: &dlock::Locks,
    name: &str,
    future: F,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = dlock::Result<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let (locks, name) = (locks.clone(), name.to_owned());
    let flush: runtime::Flush = Box::pin(async move {
        // Any call through the store's connection does; its answer does not matter.
        let _ = locks.inspect(&name).await;
    });
    run_flushed(py, aio, future, Some(flush))
}

fn run_flushed<'py, F, T>(
    py: Python<'py>,
    aio: Option<Bound<'py, Notifier>>,
    future: F,
    flush: Option<runtime::Flush>,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = dlock::Result<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    match aio {
        // Cancellation needs no flush: the process goes on, so the clean-up completes.
        Some(notifier) => bridge::start(&notifier, future),
        None => {
            let value = runtime::block_flushed(py, future, flush)?
                .map_err(|error| errors::to_py(py, error))?;
            value.into_bound_py_any(py)
        }
    }
}

/// The connection of this process to one store.
struct Connected {
    pid: u32,
    locks: dlock::Locks,
}

/// A connection to one lock store (`dlock.connect(url)`); reconnects by itself in a forked
/// child, which must not share the parent's sockets or lease keeper.
#[pyclass(module = "dlock._dlock", frozen)]
struct Client {
    /// Kept to reconnect after a fork; never shown (it may hold a password).
    url: String,
    label: Option<String>,
    watchdog_lease: Option<Duration>,
    backend: &'static str,
    connected: Mutex<Option<Connected>>,
}

impl Drop for Client {
    fn drop(&mut self) {
        let connected = self
            .connected
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(stale) = connected.take()
            && !runtime::is_this_process(stale.pid)
        {
            // The parent's connection: its tasks ran on threads this process lacks.
            std::mem::forget(stale);
        }
    }
}

async fn open(
    url: String,
    label: Option<String>,
    watchdog_lease: Option<Duration>,
) -> dlock::Result<dlock::Locks> {
    let mut locks = dlock::connect(&url).await?;
    if let Some(label) = label {
        locks = locks.with_label(label)?;
    }
    if let Some(lease) = watchdog_lease {
        locks = locks.with_watchdog_lease(lease)?;
    }
    Ok(locks)
}

impl Client {
    /// This process's connection, reconnecting first in a forked child.
    fn locks(&self, py: Python<'_>) -> PyResult<dlock::Locks> {
        let pid = std::process::id();
        {
            let connected = self
                .connected
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(c) = connected.as_ref()
                && c.pid == pid
            {
                return Ok(c.locks.clone());
            }
        }
        let fresh = runtime::block(
            py,
            open(self.url.clone(), self.label.clone(), self.watchdog_lease),
        )?
        .map_err(|error| errors::to_py(py, error))?;
        let mut connected = self
            .connected
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(stale) = connected.take()
            && !runtime::is_this_process(stale.pid)
        {
            // A stale connection is only ever the parent's (same reason as in Drop).
            std::mem::forget(stale);
        }
        *connected = Some(Connected {
            pid,
            locks: fresh.clone(),
        });
        Ok(fresh)
    }
}

#[pymethods]
impl Client {
    /// Connects to the store named by `url` (see `dlock.connect`).
    #[new]
    #[pyo3(signature = (url, label=None, watchdog_lease=None))]
    fn new(
        py: Python<'_>,
        url: String,
        label: Option<String>,
        watchdog_lease: Option<f64>,
    ) -> PyResult<Client> {
        let watchdog_lease = watchdog_lease
            .map(|s| seconds("watchdog_lease", s))
            .transpose()?;
        let locks = runtime::block(py, open(url.clone(), label.clone(), watchdog_lease))?
            .map_err(|error| errors::to_py(py, error))?;
        Ok(Client {
            url,
            label,
            watchdog_lease,
            backend: locks.info().name,
            connected: Mutex::new(Some(Connected {
                pid: std::process::id(),
                locks,
            })),
        })
    }

    /// The backend's name: "sqlite", "redis", "postgres", …
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    /// The lease length of locks without a `timeout`, renewed by the watchdog, in seconds.
    #[getter]
    fn watchdog_lease(&self, py: Python<'_>) -> PyResult<f64> {
        Ok(self.locks(py)?.watchdog_lease().as_secs_f64())
    }

    /// Acquires the exclusive lock `name`; `None` when `wait` ran out.
    #[pyo3(signature = (name, ttl=None, wait=None, fair=false, reentrant=false, max_hold=None, aio=None))]
    #[allow(clippy::too_many_arguments)]
    fn mutex<'py>(
        &self,
        py: Python<'py>,
        name: String,
        ttl: Option<f64>,
        wait: Option<f64>,
        fair: bool,
        reentrant: bool,
        max_hold: Option<f64>,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ttl = ttl.map(|s| seconds("ttl", s)).transpose()?;
        let max_hold = max_hold.map(|s| seconds("max_hold", s)).transpose()?;
        let wait = WaitFor::from_py(wait)?;
        let locks = self.locks(py)?;
        let mut builder = configure!(locks.mutex(name.clone()), ttl, wait, max_hold);
        if fair {
            builder = builder.fair();
        }
        if reentrant {
            builder = builder.reentrant();
        }
        run_acquire(py, aio, &locks, &name.clone(), async move {
            timed_out_is_none(builder.acquire().await, |g| Hold::new(name, g))
        })
    }

    /// Takes a read hold of the read-write lock `name`; `None` when `wait` ran out.
    #[pyo3(signature = (name, max_readers=None, ttl=None, wait=None, max_hold=None, aio=None))]
    #[allow(clippy::too_many_arguments)]
    fn read<'py>(
        &self,
        py: Python<'py>,
        name: String,
        max_readers: Option<u32>,
        ttl: Option<f64>,
        wait: Option<f64>,
        max_hold: Option<f64>,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ttl = ttl.map(|s| seconds("ttl", s)).transpose()?;
        let max_hold = max_hold.map(|s| seconds("max_hold", s)).transpose()?;
        let wait = WaitFor::from_py(wait)?;
        let locks = self.locks(py)?;
        let mut builder = locks.rwlock(name.clone());
        if let Some(max) = max_readers {
            builder = builder.max_readers(max);
        }
        let builder = configure!(builder, ttl, wait, max_hold);
        run_acquire(py, aio, &locks, &name.clone(), async move {
            timed_out_is_none(builder.read().await, |g| Hold::new(name, g))
        })
    }

    /// Takes the write hold of the read-write lock `name`; `None` when `wait` ran out.
    #[pyo3(signature = (name, max_readers=None, ttl=None, wait=None, max_hold=None, aio=None))]
    #[allow(clippy::too_many_arguments)]
    fn write<'py>(
        &self,
        py: Python<'py>,
        name: String,
        max_readers: Option<u32>,
        ttl: Option<f64>,
        wait: Option<f64>,
        max_hold: Option<f64>,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ttl = ttl.map(|s| seconds("ttl", s)).transpose()?;
        let max_hold = max_hold.map(|s| seconds("max_hold", s)).transpose()?;
        let wait = WaitFor::from_py(wait)?;
        let locks = self.locks(py)?;
        let mut builder = locks.rwlock(name.clone());
        if let Some(max) = max_readers {
            builder = builder.max_readers(max);
        }
        let builder = configure!(builder, ttl, wait, max_hold);
        run_acquire(py, aio, &locks, &name.clone(), async move {
            timed_out_is_none(builder.write().await, |g| Hold::new(name, g))
        })
    }

    /// Takes `count` of the `permits` permits of the semaphore `name` at once (all or
    /// nothing); `None` when `wait` ran out.
    #[pyo3(signature = (name, permits, ttl=None, wait=None, max_hold=None, aio=None, count=1))]
    #[allow(clippy::too_many_arguments)]
    fn semaphore<'py>(
        &self,
        py: Python<'py>,
        name: String,
        permits: u32,
        ttl: Option<f64>,
        wait: Option<f64>,
        max_hold: Option<f64>,
        aio: Option<Bound<'py, Notifier>>,
        count: u32,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ttl = ttl.map(|s| seconds("ttl", s)).transpose()?;
        let max_hold = max_hold.map(|s| seconds("max_hold", s)).transpose()?;
        let wait = WaitFor::from_py(wait)?;
        let locks = self.locks(py)?;
        let builder = locks.semaphore(name.clone(), permits).count(count);
        let builder = configure!(builder, ttl, wait, max_hold);
        run_acquire(py, aio, &locks, &name.clone(), async move {
            timed_out_is_none(builder.acquire().await, |g| {
                let fences = g
                    .slots()
                    .into_iter()
                    .map(|(slot, fence)| (slot.as_str().to_owned(), fence.get()))
                    .collect();
                Hold::with_fences(name, fences, g)
            })
        })
    }

    /// Acquires every lock in `names` or none; `None` when `wait` ran out.
    #[pyo3(signature = (names, ttl=None, wait=None, max_hold=None, aio=None))]
    fn multi_lock<'py>(
        &self,
        py: Python<'py>,
        names: Vec<String>,
        ttl: Option<f64>,
        wait: Option<f64>,
        max_hold: Option<f64>,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ttl = ttl.map(|s| seconds("ttl", s)).transpose()?;
        let max_hold = max_hold.map(|s| seconds("max_hold", s)).transpose()?;
        let wait = WaitFor::from_py(wait)?;
        let label = names.join(",");
        let first = names.first().cloned().unwrap_or_default();
        let locks = self.locks(py)?;
        let builder = configure!(locks.multi_lock(names), ttl, wait, max_hold);
        run_acquire(py, aio, &locks, &first, async move {
            timed_out_is_none(builder.acquire().await, |g| {
                let fences = g
                    .fences()
                    .map(|(name, fence)| (name.as_str().to_owned(), fence.get()))
                    .collect();
                Hold::with_fences(label, fences, g)
            })
        })
    }

    /// Who holds `name`, as a tuple (see `dlock.LockInfo`), or `None` when it is free.
    #[pyo3(signature = (name, aio=None))]
    fn inspect<'py>(
        &self,
        py: Python<'py>,
        name: String,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let locks = self.locks(py)?;
        run(py, aio, async move {
            Ok(locks.inspect(&name).await?.map(info_tuple))
        })
    }

    /// Every held lock whose name starts with `prefix`, as tuples.
    #[pyo3(signature = (prefix=String::new(), aio=None))]
    fn list<'py>(
        &self,
        py: Python<'py>,
        prefix: String,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let locks = self.locks(py)?;
        run(py, aio, async move {
            let infos: Vec<dlock::LockInfo> = locks.list(&prefix).try_collect().await?;
            Ok(infos.into_iter().map(info_tuple).collect::<Vec<_>>())
        })
    }

    /// Frees `name` whoever holds it (an operator's tool); true if it was held.
    #[pyo3(signature = (name, aio=None))]
    fn force_release<'py>(
        &self,
        py: Python<'py>,
        name: String,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let locks = self.locks(py)?;
        run(py, aio, async move { locks.force_release(&name).await })
    }

    /// The versioned value `name` as `(bytes, version)`, or `None` if never written.
    #[pyo3(signature = (name, aio=None))]
    fn value_get<'py>(
        &self,
        py: Python<'py>,
        name: String,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let value = self.locks(py)?.value(name);
        run(py, aio, async move {
            Ok(value.get().await?.map(|v| (Bytes(v.value), v.version)))
        })
    }

    /// Writes `data` if the version is still `expected` (`None`: never written); the new
    /// version, or `None` when another writer came first.
    #[pyo3(signature = (name, expected, data, aio=None))]
    fn value_compare_and_set<'py>(
        &self,
        py: Python<'py>,
        name: String,
        expected: Option<u64>,
        data: Vec<u8>,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let value = self.locks(py)?.value(name);
        run(py, aio, async move {
            value.compare_and_set(expected, data).await
        })
    }

    /// Writes `data` whatever the version; the new version.
    #[pyo3(signature = (name, data, aio=None))]
    fn value_set<'py>(
        &self,
        py: Python<'py>,
        name: String,
        data: Vec<u8>,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let value = self.locks(py)?.value(name);
        run(py, aio, async move { value.set(data).await })
    }

    /// Writes `data` only while `hold` is still its lock's current holder, the store checking
    /// and writing in one step; the new version (`LockNotOwnedError` once it is not).
    #[pyo3(signature = (name, hold, data, aio=None))]
    fn value_set_fenced<'py>(
        &self,
        py: Python<'py>,
        name: String,
        hold: PyRef<'py, hold::Hold>,
        data: Vec<u8>,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let write = hold.set_fenced(self.locks(py)?.value(name), data);
        run(py, aio, write)
    }

    /// The Rust core's `VersionedValue::update` (its retry pacing, at most `max_attempts`
    /// attempts): `change(current)` is called with the GIL held for each attempt, on the
    /// caller's thread (with `aio`: the event loop's) and returns the bytes to write or `None`
    /// to write nothing. `(bytes, version)` written, or `None` when `change` declined. An
    /// exception raised by `change` ends the update, nothing written, and propagates.
    #[pyo3(signature = (name, max_attempts, change, aio=None))]
    fn value_update<'py>(
        &self,
        py: Python<'py>,
        name: String,
        max_attempts: u32,
        change: Bound<'py, PyAny>,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let value = self.locks(py)?.value(name).max_attempts(max_attempts);
        if let Some(notifier) = aio {
            // The runtime's threads never run Python: each attempt asks the loop's thread.
            return bridge::start_asking(&notifier, change, move |asker| async move {
                Ok(value
                    .update(|current| asker.ask(current))
                    .await?
                    .map(versioned))
            });
        }
        // Sent to the runtime with the future: only an unbound reference may cross threads.
        let change = change.unbind();
        let mut failure = None;
        let updated = runtime::block(
            py,
            value.update(|current| {
                // The update runs on this thread (the runtime's `block_on`), GIL released: take
                // it back for the callback, outside the runtime's context, so that the callback
                // may call dlock's blocking API itself (a nested `block_on` would panic).
                tokio::task::block_in_place(|| {
                    Python::attach(|py| {
                        let current = current.map(|c| PyBytes::new(py, c));
                        let answer = change
                            .bind(py)
                            .call1((current,))
                            .and_then(|answer| written_bytes(&answer));
                        // Declining ends the update without a write; the error is raised after.
                        answer.unwrap_or_else(|error| {
                            failure = Some(error);
                            None
                        })
                    })
                })
            }),
        )?;
        if let Some(error) = failure {
            return Err(error);
        }
        updated
            .map_err(|error| errors::to_py(py, error))?
            .map(versioned)
            .into_bound_py_any(py)
    }
}

/// The URL `dlock.connect()` uses without one: the dlock command's default, a SQLite file in
/// the user's state directory (`~/.local/state/dlock/locks.db` on Linux).
#[pyfunction]
fn default_url() -> String {
    let base = dirs::state_dir()
        .or_else(dirs::data_local_dir)
        .unwrap_or_else(std::env::temp_dir);
    let path = base.join("dlock").join("locks.db");
    format!("sqlite://{}?create_dirs=true", path.display())
}

/// The URL schemes this build of dlock accepts.
#[pyfunction]
fn enabled_schemes() -> Vec<&'static str> {
    dlock::enabled_schemes()
}

#[pymodule]
fn _dlock(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Client>()?;
    module.add_class::<Hold>()?;
    module.add_class::<Notifier>()?;
    module.add_class::<bridge::Task>()?;
    module.add_class::<bridge::Ask>()?;
    module.add_class::<election::Observer>()?;
    module.add_function(wrap_pyfunction!(election::election_campaign, module)?)?;
    module.add_function(wrap_pyfunction!(election::election_leader, module)?)?;
    module.add_function(wrap_pyfunction!(election::election_proclaim, module)?)?;
    module.add_function(wrap_pyfunction!(election::election_observe, module)?)?;
    module.add_function(wrap_pyfunction!(coordination::counter_get, module)?)?;
    module.add_function(wrap_pyfunction!(coordination::counter_add, module)?)?;
    module.add_function(wrap_pyfunction!(
        coordination::counter_compare_and_set,
        module
    )?)?;
    module.add_function(wrap_pyfunction!(coordination::latch_try_set_count, module)?)?;
    module.add_function(wrap_pyfunction!(coordination::latch_count_down, module)?)?;
    module.add_function(wrap_pyfunction!(coordination::latch_count, module)?)?;
    module.add_function(wrap_pyfunction!(coordination::latch_wait, module)?)?;
    module.add_class::<barrier::BarrierHold>()?;
    module.add_class::<barrier::Participant>()?;
    module.add_function(wrap_pyfunction!(barrier::barrier_set, module)?)?;
    module.add_function(wrap_pyfunction!(barrier::barrier_wait, module)?)?;
    module.add_function(wrap_pyfunction!(barrier::barrier_remove, module)?)?;
    module.add_function(wrap_pyfunction!(barrier::double_barrier_enter, module)?)?;
    module.add(
        "DEFAULT_UPDATE_ATTEMPTS",
        dlock::limits::DEFAULT_UPDATE_ATTEMPTS,
    )?;
    module.add_function(wrap_pyfunction!(default_url, module)?)?;
    module.add_function(wrap_pyfunction!(enabled_schemes, module)?)?;
    Ok(())
}
