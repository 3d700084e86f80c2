//! Leader election for Python: `campaign` (a [`Hold`] of the election's leadership),
//! `proclaim` on that hold, `leader` and [`Observer`] (the leader's changes), each as a
//! blocking call or an asyncio awaitable like every other store call.

use std::sync::Arc;
use std::time::SystemTime;

use futures::StreamExt;
use pyo3::prelude::*;

use crate::bridge::Notifier;
use crate::convert::{Bytes, WaitFor, seconds};
use crate::hold::{Hold, timed_out_is_none};
use crate::{Client, run, run_acquire};

/// A leader as Python gets it: term, value, label, host, pid, since (Unix seconds), lease
/// seconds left (`None` for a session).
type LeaderTuple = (u64, Bytes, Option<String>, String, u32, f64, Option<f64>);

fn leader_tuple(leader: dlock::Leader) -> LeaderTuple {
    let since = leader
        .since
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    (
        leader.term.get(),
        Bytes(leader.value),
        leader.owner.label,
        leader.owner.host,
        leader.owner.pid,
        since,
        leader.ttl_left.map(|d| d.as_secs_f64()),
    )
}

fn election(
    client: &Client,
    py: Python<'_>,
    name: String,
    ttl: Option<f64>,
) -> PyResult<(dlock::Locks, dlock::Election)> {
    let locks = client.locks(py)?;
    let mut election = locks.election(name);
    if let Some(ttl) = ttl {
        election = election.ttl(seconds("ttl", ttl)?);
    }
    Ok((locks, election))
}

/// Waits to lead `name`, publishes `value`; the leadership's hold, or `None` when `wait` ran
/// out.
#[pyfunction]
#[pyo3(signature = (client, name, value, ttl=None, wait=None, aio=None))]
pub(crate) fn election_campaign<'py>(
    py: Python<'py>,
    client: &Client,
    name: String,
    value: Vec<u8>,
    ttl: Option<f64>,
    wait: Option<f64>,
    aio: Option<Bound<'py, Notifier>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (locks, mut election) = election(client, py, name.clone(), ttl)?;
    match WaitFor::from_py(wait)? {
        WaitFor::Forever => {}
        WaitFor::No => election = election.wait(std::time::Duration::ZERO),
        WaitFor::For(d) => election = election.wait(d),
    }
    run_acquire(py, aio, &locks, &name.clone(), async move {
        timed_out_is_none(election.campaign(value).await, |g| Hold::new(name, g))
    })
}

/// Who leads `name` now, as a tuple, or `None`.
#[pyfunction]
#[pyo3(signature = (client, name, aio=None))]
pub(crate) fn election_leader<'py>(
    py: Python<'py>,
    client: &Client,
    name: String,
    aio: Option<Bound<'py, Notifier>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (_, election) = election(client, py, name, None)?;
    run(py, aio, async move {
        Ok(election.leader().await?.map(leader_tuple))
    })
}

/// Publishes `value` as the leader of the election `hold` leads.
#[pyfunction]
#[pyo3(signature = (hold, value, aio=None))]
pub(crate) fn election_proclaim<'py>(
    py: Python<'py>,
    hold: &Hold,
    value: Vec<u8>,
    aio: Option<Bound<'py, Notifier>>,
) -> PyResult<Bound<'py, PyAny>> {
    let proclaim = hold.proclaim(value);
    run(py, aio, proclaim)
}

/// The leader's changes of one election: `next()` waits for the next one.
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct Observer {
    stream: Arc<tokio::sync::Mutex<dlock::election::LeaderStream>>,
}

/// Follows the leader of `name`, reading the store every `interval` seconds (default: the
/// client's watchdog lease / 3, at most 1 s).
#[pyfunction]
#[pyo3(signature = (client, name, interval=None))]
pub(crate) fn election_observe(
    py: Python<'_>,
    client: &Client,
    name: String,
    interval: Option<f64>,
) -> PyResult<Observer> {
    let (_, mut election) = election(client, py, name, None)?;
    if let Some(every) = interval {
        election = election.observe_interval(seconds("interval", every)?);
    }
    // Lazy: nothing runs until the first `next`, on the store calls' runtime.
    Ok(Observer {
        stream: Arc::new(tokio::sync::Mutex::new(election.observe())),
    })
}

#[pymethods]
impl Observer {
    /// `(True, leader tuple or None)` for the next change; `(False, None)` once the stream
    /// ended (after an unsupported request's error).
    #[pyo3(signature = (aio=None))]
    fn next<'py>(
        &self,
        py: Python<'py>,
        aio: Option<Bound<'py, Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let stream = self.stream.clone();
        run(py, aio, async move {
            match stream.lock().await.next().await {
                Some(item) => Ok((true, item?.map(leader_tuple))),
                None => Ok((false, None)),
            }
        })
    }
}
