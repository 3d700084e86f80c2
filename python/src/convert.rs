//! Values between Python and the Rust API: seconds, waits, bytes, lock descriptions.

use std::time::{Duration, SystemTime};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Seconds from Python as a `Duration`: a clear `ValueError` for negative, NaN or huge values.
pub(crate) fn seconds(what: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{what} must be a finite, non-negative number of seconds, not {value}"
        ))
    })
}

/// How long an acquisition waits.
#[derive(Clone, Copy)]
pub(crate) enum WaitFor {
    Forever,
    No,
    For(Duration),
}

impl WaitFor {
    /// `None`: until acquired; `0`: one try; otherwise at most that many seconds.
    pub(crate) fn from_py(wait: Option<f64>) -> PyResult<WaitFor> {
        Ok(match wait {
            None => WaitFor::Forever,
            Some(s) => match seconds("wait", s)? {
                d if d.is_zero() => WaitFor::No,
                d => WaitFor::For(d),
            },
        })
    }
}

/// Applies the lease and wait options shared by every builder of the Rust API.
macro_rules! configure {
    ($builder:expr, $ttl:expr, $wait:expr, $max_hold:expr) => {{
        let mut builder = $builder;
        if let Some(ttl) = $ttl {
            builder = builder.ttl(ttl);
        }
        if let Some(max) = $max_hold {
            builder = builder.max_hold(max);
        }
        match $wait {
            $crate::convert::WaitFor::Forever => builder.wait_forever(),
            $crate::convert::WaitFor::No => builder.no_wait(),
            $crate::convert::WaitFor::For(d) => builder.wait(d),
        }
    }};
}
pub(crate) use configure;

/// Bytes that become a Python `bytes` (a `Vec<u8>` would become a list).
pub(crate) struct Bytes(pub(crate) Vec<u8>);

impl<'py> IntoPyObject<'py> for Bytes {
    type Target = PyBytes;
    type Output = Bound<'py, PyBytes>;
    type Error = std::convert::Infallible;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        Ok(PyBytes::new(py, &self.0))
    }
}

/// A lock as `inspect` and `list` describe it: name, fence, label, host, pid, acquired at
/// (Unix seconds), lease seconds left (`None` for a session), hold count, waiters (`None` when
/// the store cannot count them).
pub(crate) type InfoTuple = (
    String,
    u64,
    Option<String>,
    String,
    u32,
    f64,
    Option<f64>,
    u32,
    Option<u32>,
);

pub(crate) fn info_tuple(info: dlock::LockInfo) -> InfoTuple {
    let acquired = info
        .acquired_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    (
        info.name,
        info.fence.get(),
        info.owner.label,
        info.owner.host,
        info.owner.pid,
        acquired,
        info.ttl_left.map(|d| d.as_secs_f64()),
        info.holds,
        info.waiters,
    )
}

/// A written value as Python gets it: `(bytes, version)`.
pub(crate) fn versioned(written: dlock::Versioned) -> (Bytes, u64) {
    (Bytes(written.value), written.version)
}

/// An update callback's answer: `None` declines, otherwise `bytes` to write.
pub(crate) fn written_bytes(answer: &Bound<'_, PyAny>) -> PyResult<Option<Vec<u8>>> {
    if answer.is_none() {
        return Ok(None);
    }
    Ok(Some(answer.cast::<PyBytes>()?.as_bytes().to_vec()))
}
