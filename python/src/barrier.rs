//! Barriers and double barriers for Python: `barrier_set` gives a [`BarrierHold`] (the raised
//! barrier), `barrier_wait` and `barrier_remove` act on the name, and `double_barrier_enter`
//! gives a [`Participant`] (one participant inside) that leaves with `leave`; each a blocking
//! call or an asyncio awaitable like every other store call.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::prelude::*;

use crate::bridge::Notifier;
use crate::convert::seconds;
use crate::{Client, run};

/// How long a wait lasts when Python passes no timeout: for ever, in practice.
const NO_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn timeout_of(timeout: Option<f64>) -> PyResult<Duration> {
    Ok(timeout
        .map(|t| seconds("timeout", t))
        .transpose()?
        .unwrap_or(NO_TIMEOUT))
}

fn barrier(
    client: &Client,
    py: Python<'_>,
    name: String,
    ttl: Option<f64>,
) -> PyResult<dlock::Barrier> {
    let mut barrier = client.locks(py)?.barrier(name);
    if let Some(ttl) = ttl {
        barrier = barrier.ttl(seconds("ttl", ttl)?);
    }
    Ok(barrier)
}

/// A raised barrier: it stands until `remove()`, until it is dropped (removed in the
/// background), or until its lease is lost.
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct BarrierHold {
    name: String,
    /// `None` once removed.
    guard: Arc<Mutex<Option<dlock::BarrierGuard>>>,
}

#[pymethods]
impl BarrierHold {
    /// The barrier's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Whether the barrier's lease is known to be lost (it no longer stands); false once
    /// removed.
    fn is_lost(&self) -> bool {
        let guard = self.guard.lock().unwrap_or_else(PoisonError::into_inner);
        guard.as_ref().is_some_and(dlock::BarrierGuard::is_lost)
    }

    /// Whether `remove()` was called.
    fn is_removed(&self) -> bool {
        let guard = self.guard.lock().unwrap_or_else(PoisonError::into_inner);
        guard.is_none()
    }

    /// Removes the barrier: every waiter goes on. `LockNotOwnedError` when its lease was lost
    /// (it was down already) or it was removed before.
    #[pyo3(signature = (aio=None))]
    fn remove<'py>(
        &self,
        py: Python<'py>,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let taken = self
            .guard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let name = self.name.clone();
        run(py, aio, async move {
            match taken {
                Some(guard) => guard.remove().await,
                None => Err(dlock::Error::NotOwned { name }),
            }
        })
    }
}

/// Raises the barrier `name`, waiting at most `timeout` seconds for one already raised to come
/// down (`LockTimeoutError` then).
#[pyfunction]
#[pyo3(signature = (client, name, ttl=None, timeout=None, aio=None))]
pub(crate) fn barrier_set<'py>(
    py: Python<'py>,
    client: &Client,
    name: String,
    ttl: Option<f64>,
    timeout: Option<f64>,
    aio: Option<Bound<'py, Notifier>>,
) -> PyResult<Bound<'py, PyAny>> {
    let barrier = barrier(client, py, name.clone(), ttl)?;
    let timeout = timeout_of(timeout)?;
    run(py, aio, async move {
        let guard = barrier.set(timeout).await?;
        Ok(BarrierHold {
            name,
            guard: Arc::new(Mutex::new(Some(guard))),
        })
    })
}

/// Waits until the barrier `name` is down: `True`, or `False` when `timeout` seconds passed.
#[pyfunction]
#[pyo3(signature = (client, name, timeout=None, aio=None))]
pub(crate) fn barrier_wait<'py>(
    py: Python<'py>,
    client: &Client,
    name: String,
    timeout: Option<f64>,
    aio: Option<Bound<'py, Notifier>>,
) -> PyResult<Bound<'py, PyAny>> {
    let barrier = barrier(client, py, name, None)?;
    let timeout = timeout_of(timeout)?;
    run(py, aio, async move {
        match barrier.wait_on(timeout).await {
            Ok(()) => Ok(true),
            Err(dlock::Error::Timeout { .. }) => Ok(false),
            Err(error) => Err(error),
        }
    })
}

/// Removes the barrier `name` whoever raised it; whether it stood.
#[pyfunction]
#[pyo3(signature = (client, name, aio=None))]
pub(crate) fn barrier_remove<'py>(
    py: Python<'py>,
    client: &Client,
    name: String,
    aio: Option<Bound<'py, Notifier>>,
) -> PyResult<Bound<'py, PyAny>> {
    let barrier = barrier(client, py, name, None)?;
    run(py, aio, async move { barrier.remove().await })
}

/// One participant inside a double barrier: its presence lasts until `leave()` or until it is
/// dropped (it then leaves at once, without waiting for the others).
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct Participant {
    name: String,
    /// `None` once it left.
    inside: Arc<Mutex<Option<dlock::Inside>>>,
}

#[pymethods]
impl Participant {
    /// The double barrier's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Whether this participant's presence lease is known to be lost.
    fn is_lost(&self) -> bool {
        let inside = self.inside.lock().unwrap_or_else(PoisonError::into_inner);
        inside.as_ref().is_some_and(dlock::Inside::is_lost)
    }

    /// Whether `leave()` was called.
    fn has_left(&self) -> bool {
        let inside = self.inside.lock().unwrap_or_else(PoisonError::into_inner);
        inside.is_none()
    }

    /// Leaves, and waits at most `timeout` seconds until every participant has left
    /// (`LockTimeoutError` then). `LockNotOwnedError` when it left before.
    #[pyo3(signature = (timeout=None, aio=None))]
    fn leave<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let timeout = timeout_of(timeout)?;
        let taken = self
            .inside
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let name = self.name.clone();
        run(py, aio, async move {
            match taken {
                Some(inside) => inside.leave(timeout).await,
                None => Err(dlock::Error::NotOwned { name }),
            }
        })
    }
}

/// Enters the double barrier `name` of `participants`, waiting at most `timeout` seconds for
/// all of them (`LockTimeoutError` then).
#[pyfunction]
#[pyo3(signature = (client, name, participants, ttl=None, interval=None, timeout=None, aio=None))]
#[allow(clippy::too_many_arguments)] // One per Python keyword, as every binding here.
pub(crate) fn double_barrier_enter<'py>(
    py: Python<'py>,
    client: &Client,
    name: String,
    participants: u32,
    ttl: Option<f64>,
    interval: Option<f64>,
    timeout: Option<f64>,
    aio: Option<Bound<'py, Notifier>>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut barrier = client.locks(py)?.double_barrier(name.clone(), participants);
    if let Some(ttl) = ttl {
        barrier = barrier.ttl(seconds("ttl", ttl)?);
    }
    if let Some(every) = interval {
        barrier = barrier.poll_interval(seconds("interval", every)?);
    }
    let timeout = timeout_of(timeout)?;
    run(py, aio, async move {
        let inside = barrier.enter(timeout).await?;
        Ok(Participant {
            name,
            inside: Arc::new(Mutex::new(Some(inside))),
        })
    })
}
