//! dlock's one error enum as Python exceptions: the classes live in `dlock/exceptions.py`
//! (plain Python, so they can have redis-py's constructor and several bases).

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;

static EXCEPTIONS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// Raises `class_name` from `dlock.exceptions` with `message` and, where there is one, the
/// lock's name (redis-py's `LockError(message, lock_name=...)`).
pub(crate) fn raise(
    py: Python<'_>,
    class_name: &str,
    message: String,
    lock_name: Option<String>,
) -> PyErr {
    let made = (|| -> PyResult<PyErr> {
        let module = EXCEPTIONS.get_or_try_init(py, || {
            PyModule::import(py, "dlock.exceptions").map(Bound::unbind)
        })?;
        let class = module.bind(py).getattr(class_name)?;
        let instance = class.call1((message.clone(), lock_name))?;
        Ok(PyErr::from_value(instance))
    })();
    // Only a broken installation (dlock.exceptions missing) gets here; the message survives.
    made.unwrap_or_else(|_| PyRuntimeError::new_err(message))
}

/// The Python exception for a dlock error. Messages come from dlock, which never puts a URL's
/// password in one (URLs are redacted before they reach an error).
pub(crate) fn to_py(py: Python<'_>, error: dlock::Error) -> PyErr {
    use dlock::Error as E;
    let message = error.to_string();
    match error {
        E::NotOwned { name } => raise(py, "LockNotOwnedError", message, Some(name)),
        // A fenced write whose hold the store found no longer current: nothing was written.
        E::Lost { .. } => raise(py, "LockNotOwnedError", message, None),
        E::Timeout { name, .. } => raise(py, "LockTimeoutError", message, Some(name)),
        E::InvalidName { .. } | E::InvalidArgument { .. } | E::InvalidUrl { .. } => {
            PyValueError::new_err(message)
        }
        E::Unsupported { .. } => raise(py, "UnsupportedError", message, None),
        E::Conflict { name, .. } => raise(py, "ConflictError", message, Some(name)),
        E::Unavailable { .. } => raise(py, "StoreUnavailableError", message, None),
        _ => raise(py, "StoreError", message, None),
    }
}
