//! `Hold`: one acquired lock, permit or lock set, as the Python layer sees it.

use std::sync::Arc;

use dlock::Hold as _;
use pyo3::prelude::*;
use tokio_util::sync::CancellationToken;

use crate::convert::seconds;
use crate::runtime::is_this_process;

struct Inner {
    /// The process that acquired it: in a forked child the hold is the parent's, never ours.
    pid: u32,
    name: String,
    fences: Vec<(String, u64)>,
    lost: CancellationToken,
    /// `None` once released. An async mutex: extend and release await the store while holding it,
    /// so a release waits for an extend in flight instead of racing it.
    guard: tokio::sync::Mutex<Option<Box<dyn dlock::Hold>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !is_this_process(self.pid) {
            // The parent's hold: releasing it from here would free the parent's lock, and its
            // runtime has no threads in this process anyway.
            if let Some(held) = self.guard.get_mut().take() {
                std::mem::forget(held);
            }
        }
        // In the acquiring process the guard's own Drop releases in the background.
    }
}

/// An acquired lock, read or write hold, semaphore permit or multi-lock. Dropping it releases in
/// the background; `release()` releases now and reports a lost hold.
#[pyclass(module = "dlock._dlock", frozen)]
pub(crate) struct Hold {
    inner: Arc<Inner>,
}

impl Hold {
    /// A hold of one store lock, reported under `name`.
    pub(crate) fn new(name: String, guard: impl dlock::Hold) -> Hold {
        let fences = vec![(name.clone(), guard.fence().get())];
        Hold::with_fences(name, fences, guard)
    }

    /// A hold whose store locks have names of their own (a permit's slot, a multi-lock's
    /// locks).
    pub(crate) fn with_fences(
        name: String,
        fences: Vec<(String, u64)>,
        guard: impl dlock::Hold,
    ) -> Hold {
        Hold {
            inner: Arc::new(Inner {
                pid: std::process::id(),
                name,
                fences,
                lost: guard.lost_token(),
                guard: tokio::sync::Mutex::new(Some(Box::new(guard))),
            }),
        }
    }

    fn not_owned(&self) -> dlock::Error {
        // dlock's own error, so the message and class match a hold lost in the store.
        dlock::Error::NotOwned {
            name: self.inner.name.clone(),
        }
    }

    fn forked(&self) -> bool {
        !is_this_process(self.inner.pid)
    }

    /// `VersionedValue::set_fenced` with this hold: the value written only while the hold is
    /// still its lock's current holder.
    pub(crate) fn set_fenced(
        &self,
        value: dlock::VersionedValue,
        data: Vec<u8>,
    ) -> impl std::future::Future<Output = dlock::Result<u64>> + Send + 'static {
        let inner = self.inner.clone();
        let forked = self.forked().then(|| self.not_owned());
        async move {
            if let Some(error) = forked {
                return Err(error);
            }
            let guard = inner.guard.lock().await;
            match guard.as_deref() {
                Some(held) => value.set_fenced(held, data).await,
                None => Err(dlock::Error::NotOwned {
                    name: inner.name.clone(),
                }),
            }
        }
    }

    /// `Leadership::proclaim` on the hold, when it is an election's leadership.
    pub(crate) fn proclaim(
        &self,
        value: Vec<u8>,
    ) -> impl std::future::Future<Output = dlock::Result<()>> + Send + 'static {
        let inner = self.inner.clone();
        let forked = self.forked().then(|| self.not_owned());
        async move {
            if let Some(error) = forked {
                return Err(error);
            }
            let guard = inner.guard.lock().await;
            let held: Option<&dyn std::any::Any> = guard.as_deref().map(|held| held as _);
            match held.map(<dyn std::any::Any>::downcast_ref::<dlock::Leadership>) {
                Some(Some(leading)) => leading.proclaim(value).await,
                Some(None) => Err(dlock::Error::InvalidArgument {
                    what: "proclaim",
                    reason: "only an election's leadership can proclaim".into(),
                }),
                None => Err(dlock::Error::NotOwned {
                    name: inner.name.clone(),
                }),
            }
        }
    }
}

#[pymethods]
impl Hold {
    /// The lock's name (for a multi-lock, the names joined by commas).
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// The fencing token of this hold (for a multi-lock, the largest of its locks' fences).
    #[getter]
    fn fence(&self) -> u64 {
        self.inner
            .fences
            .iter()
            .map(|(_, fence)| *fence)
            .max()
            .unwrap_or(0)
    }

    /// Each store lock's name and fence (a multi-lock has several).
    #[getter]
    fn fences(&self) -> Vec<(String, u64)> {
        self.inner.fences.clone()
    }

    /// Whether the hold is known to be lost (lease expired, renewal refused, broken). In a
    /// forked child a hold of the parent is always lost: the child never owned it.
    fn is_lost(&self) -> bool {
        self.forked() || self.inner.lost.is_cancelled()
    }

    /// Why the hold was lost (`"expired"`, `"renewal_refused"`, `"store_unreachable"`,
    /// `"broken"`, `"session_ended"`, `"store_signal"`), once it is; `None` while held, once
    /// released, or in a forked child (the hold was never its own).
    fn lost_reason(&self) -> Option<&'static str> {
        if self.forked() || !self.inner.lost.is_cancelled() {
            return None;
        }
        // A release or extend in flight holds the guard: the signal fired, so the reason is
        // the store's word until the guard can be read.
        let reason = match self.inner.guard.try_lock() {
            Ok(guard) => match guard.as_ref() {
                Some(held) => held.lost_reason(),
                None => return None,
            },
            Err(_) => None,
        };
        Some(reason.unwrap_or(dlock::LostReason::StoreSignal).as_str())
    }

    /// Waits until the hold is lost or `timeout` seconds pass (`None`: no limit); true if lost.
    #[pyo3(signature = (timeout=None, aio=None))]
    fn wait_lost<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        aio: Option<Bound<'py, crate::bridge::Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let timeout = timeout.map(|t| seconds("timeout", t)).transpose()?;
        let lost = self.inner.lost.clone();
        let forked = self.forked();
        crate::run(py, aio, async move {
            if forked {
                return Ok(true);
            }
            Ok(match timeout {
                None => {
                    lost.cancelled().await;
                    true
                }
                Some(limit) => tokio::time::timeout(limit, lost.cancelled()).await.is_ok(),
            })
        })
    }

    /// Makes the lease last at least `ttl` seconds from now.
    #[pyo3(signature = (ttl, aio=None))]
    fn extend<'py>(
        &self,
        py: Python<'py>,
        ttl: f64,
        aio: Option<Bound<'py, crate::bridge::Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ttl = seconds("ttl", ttl)?;
        let inner = self.inner.clone();
        let forked = self.forked().then(|| self.not_owned());
        crate::run(py, aio, async move {
            if let Some(error) = forked {
                return Err(error);
            }
            let guard = inner.guard.lock().await;
            match guard.as_ref() {
                Some(held) => held.extend(ttl).await,
                None => Err(dlock::Error::NotOwned {
                    name: inner.name.clone(),
                }),
            }
        })
    }

    /// Asks the store whether this hold is still this process's (false once released).
    #[pyo3(signature = (aio=None))]
    fn is_owned<'py>(
        &self,
        py: Python<'py>,
        aio: Option<Bound<'py, crate::bridge::Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        let forked = self.forked();
        crate::run(py, aio, async move {
            if forked {
                return Ok(false);
            }
            let guard = inner.guard.lock().await;
            match guard.as_ref() {
                Some(held) => held.is_owned().await,
                None => Ok(false),
            }
        })
    }

    /// Re-enters a reentrant mutex hold: a new hold of the same lock, with the same fence, and
    /// one more count in the store (the lock is free once every hold is released).
    #[pyo3(signature = (aio=None))]
    fn reenter<'py>(
        &self,
        py: Python<'py>,
        aio: Option<Bound<'py, crate::bridge::Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        let forked = self.forked().then(|| self.not_owned());
        crate::run(py, aio, async move {
            if let Some(error) = forked {
                return Err(error);
            }
            let guard = inner.guard.lock().await;
            let held: Option<&dyn std::any::Any> = guard.as_deref().map(|held| held as _);
            match held.map(<dyn std::any::Any>::downcast_ref::<dlock::MutexGuard>) {
                Some(Some(held)) => {
                    let again = held.reenter().await?;
                    Ok(Hold::new(inner.name.clone(), again))
                }
                Some(None) => Err(dlock::Error::InvalidArgument {
                    what: "reenter",
                    reason: "only a mutex hold can be re-entered".into(),
                }),
                None => Err(dlock::Error::NotOwned {
                    name: inner.name.clone(),
                }),
            }
        })
    }

    /// Whether `release()` was already called.
    fn is_released(&self) -> bool {
        self.inner
            .guard
            .try_lock()
            .is_ok_and(|guard| guard.is_none())
    }

    /// Releases the hold; raises `LockNotOwnedError` if it was lost (or already released).
    #[pyo3(signature = (aio=None))]
    fn release<'py>(
        &self,
        py: Python<'py>,
        aio: Option<Bound<'py, crate::bridge::Notifier>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        let forked = self.forked().then(|| self.not_owned());
        crate::run(py, aio, async move {
            if let Some(error) = forked {
                return Err(error);
            }
            let held = inner.guard.lock().await.take();
            match held {
                Some(held) => held.release().await,
                None => Err(dlock::Error::NotOwned {
                    name: inner.name.clone(),
                }),
            }
        })
    }

    fn __repr__(&self) -> String {
        format!("<dlock Hold {:?} fence={}>", self.inner.name, self.fence())
    }
}

/// Returns the hold to Python, or `None` on timeout.
pub(crate) fn timed_out_is_none<T>(
    result: dlock::Result<T>,
    wrap: impl FnOnce(T) -> Hold,
) -> dlock::Result<Option<Hold>> {
    match result {
        Ok(held) => Ok(Some(wrap(held))),
        Err(dlock::Error::Timeout { .. }) => Ok(None),
        Err(error) => Err(error),
    }
}
