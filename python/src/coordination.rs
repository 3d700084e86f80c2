//! Counters and count-down latches for Python: each operation a blocking call or an asyncio
//! awaitable like every other store call, on a fresh `dlock::Counter` or
//! `dlock::CountDownLatch` (they are names and options, nothing to keep).

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::bridge::Notifier;
use crate::convert::seconds;
use crate::{Client, run};

/// How long `latch_wait` waits when Python passes no timeout: for ever, in practice.
const NO_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn counter(
    client: &Client,
    py: Python<'_>,
    name: String,
    attempts: u32,
) -> PyResult<dlock::Counter> {
    Ok(client.locks(py)?.counter(name).max_attempts(attempts))
}

fn latch(client: &Client, py: Python<'_>, name: String) -> PyResult<dlock::CountDownLatch> {
    Ok(client.locks(py)?.latch(name))
}

/// The count of `name` (0 when never written).
#[pyfunction]
#[pyo3(signature = (client, name, max_attempts, aio=None))]
pub(crate) fn counter_get<'py>(
    py: Python<'py>,
    client: &Client,
    name: String,
    max_attempts: u32,
    aio: Option<Bound<'py, Notifier>>,
) -> PyResult<Bound<'py, PyAny>> {
    let counter = counter(client, py, name, max_attempts)?;
    run(py, aio, async move { counter.get().await })
}

/// Adds `delta` to `name` atomically; the new count.
#[pyfunction]
#[pyo3(signature = (client, name, max_attempts, delta, aio=None))]
pub(crate) fn counter_add<'py>(
    py: Python<'py>,
    client: &Client,
    name: String,
    max_attempts: u32,
    delta: i64,
    aio: Option<Bound<'py, Notifier>>,
) -> PyResult<Bound<'py, PyAny>> {
    let counter = counter(client, py, name, max_attempts)?;
    run(py, aio, async move { counter.add(delta).await })
}

/// Sets `name` to `new` if it is `expected`; whether it was set.
#[pyfunction]
#[pyo3(signature = (client, name, max_attempts, expected, new, aio=None))]
pub(crate) fn counter_compare_and_set<'py>(
    py: Python<'py>,
    client: &Client,
    name: String,
    max_attempts: u32,
    expected: i64,
    new: i64,
    aio: Option<Bound<'py, Notifier>>,
) -> PyResult<Bound<'py, PyAny>> {
    let counter = counter(client, py, name, max_attempts)?;
    run(py, aio, async move {
        counter.compare_and_set(expected, new).await
    })
}

/// Closes the open latch `name` with `count`; whether it was set. A negative count is refused
/// here, since Rust's is unsigned.
#[pyfunction]
#[pyo3(signature = (client, name, count, aio=None))]
pub(crate) fn latch_try_set_count<'py>(
    py: Python<'py>,
    client: &Client,
    name: String,
    count: i64,
    aio: Option<Bound<'py, Notifier>>,
) -> PyResult<Bound<'py, PyAny>> {
    let count = u64::try_from(count).map_err(|_| {
        PyValueError::new_err(format!("invalid latch count: {count}; must be at least 1"))
    })?;
    let latch = latch(client, py, name)?;
    run(py, aio, async move { latch.try_set_count(count).await })
}

/// Counts the latch `name` down by one; the count left.
#[pyfunction]
#[pyo3(signature = (client, name, aio=None))]
pub(crate) fn latch_count_down<'py>(
    py: Python<'py>,
    client: &Client,
    name: String,
    aio: Option<Bound<'py, Notifier>>,
) -> PyResult<Bound<'py, PyAny>> {
    let latch = latch(client, py, name)?;
    run(py, aio, async move { latch.count_down().await })
}

/// The count of the latch `name`.
#[pyfunction]
#[pyo3(signature = (client, name, aio=None))]
pub(crate) fn latch_count<'py>(
    py: Python<'py>,
    client: &Client,
    name: String,
    aio: Option<Bound<'py, Notifier>>,
) -> PyResult<Bound<'py, PyAny>> {
    let latch = latch(client, py, name)?;
    run(py, aio, async move { latch.count().await })
}

/// Waits until the latch `name` is open: `True`, or `False` when `timeout` seconds passed.
#[pyfunction]
#[pyo3(signature = (client, name, timeout=None, interval=None, aio=None))]
pub(crate) fn latch_wait<'py>(
    py: Python<'py>,
    client: &Client,
    name: String,
    timeout: Option<f64>,
    interval: Option<f64>,
    aio: Option<Bound<'py, Notifier>>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut latch = latch(client, py, name)?;
    if let Some(every) = interval {
        latch = latch.poll_interval(seconds("interval", every)?);
    }
    let timeout = timeout.map(|t| seconds("timeout", t)).transpose()?;
    run(py, aio, async move {
        match latch.wait(timeout.unwrap_or(NO_TIMEOUT)).await {
            Ok(()) => Ok(true),
            Err(dlock::Error::Timeout { .. }) => Ok(false),
            Err(error) => Err(error),
        }
    })
}
