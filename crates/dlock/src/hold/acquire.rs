//! The one path every hold is acquired through, whatever its kind: mutexes, re-entries,
//! native permits and read-write holds, the exclusive locks of composed primitives, and a
//! multi-lock's one-step attempt. [`acquire_observed`] is its only store call: the
//! `dlock.acquire` span, the acquire metrics, and the give-back of a grant whose reply was
//! lost live there once.

use std::sync::Arc;

use tracing::Instrument;

use crate::backend::{AcquireRequest, Backend, DynBackend, Lease, LockKind, Wait};
use crate::error::{Error, Result};
use crate::hold::metric_labels::metric_labels;
use crate::hold::options::Terms;
use crate::locks::Locks;
use crate::mutex::MutexGuard;
use crate::name::LockName;

/// What the store grants: one lease per request, in order; `None` when busy or timed out.
type Granted = Option<Vec<Arc<dyn Lease>>>;

/// What one acquire call asks the store for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ask<'a> {
    /// One hold of the request's kind: a first grant, or a re-entry (`reentrant` set, the
    /// hold's own token).
    One(&'a AcquireRequest),
    /// Every lock of a multi-lock in one atomic step of the store, without waiting.
    All(&'a [AcquireRequest]),
}

impl Ask<'_> {
    fn requests(&self) -> &[AcquireRequest] {
        match self {
            Ask::One(request) => std::slice::from_ref(*request),
            Ask::All(requests) => requests,
        }
    }

    /// Whether the call may wait (for the `busy` or `timed_out` outcome and the wait metric).
    fn waits(&self) -> bool {
        self.requests()
            .iter()
            .any(|request| request.wait != Wait::No)
    }
}

/// Takes one hold of `request.kind`; `None` when busy or timed out. The lease goes to the
/// keeper in a guard with no await between, so a dropped future cannot strand it; with
/// [`Terms::reentrant`] the guard can re-enter it.
pub(crate) async fn take(
    locks: &Locks,
    terms: &Terms,
    request: AcquireRequest,
) -> Result<Option<MutexGuard>> {
    let Some(lease) = one(locks, &request).await? else {
        return Ok(None);
    };
    Ok(Some(MutexGuard::granted(locks, terms, request, lease)))
}

/// Takes the exclusive lock `name` (a part of a composed primitive), waiting until `deadline`.
pub(crate) async fn exclusive(
    locks: &Locks,
    terms: &Terms,
    name: &LockName,
    deadline: Wait,
) -> Result<Option<MutexGuard>> {
    let request = terms.request(name.clone(), LockKind::Exclusive, deadline);
    take(locks, terms, request).await
}

/// Takes every lock of `requests` in one atomic step, where the store has one: `None` where
/// it does not.
pub(crate) async fn take_all(
    locks: &Locks,
    terms: &Terms,
    requests: Vec<AcquireRequest>,
) -> Option<Result<Option<Vec<MutexGuard>>>> {
    let granted = match acquire_observed(locks, Ask::All(&requests)).await? {
        Ok(Some(leases)) if leases.len() == requests.len() => leases,
        Ok(Some(_)) => {
            return Some(Err(Error::Backend {
                backend: locks.info().name,
                source: "granted a different number of locks than asked for".into(),
            }));
        }
        Ok(None) => return Some(Ok(None)),
        Err(error) => return Some(Err(error)),
    };
    // No await from here on: the keeper takes every lease at once.
    let guards = requests
        .into_iter()
        .zip(granted)
        .map(|(request, lease)| MutexGuard::granted(locks, terms, request, lease))
        .collect();
    Some(Ok(Some(guards)))
}

/// [`acquire_observed`] for one request.
pub(crate) async fn one(locks: &Locks, request: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
    match acquire_observed(locks, Ask::One(request)).await {
        Some(Ok(granted)) => Ok(granted.and_then(|mut leases| leases.pop())),
        Some(Err(error)) => Err(error),
        // The store always answers a single request.
        None => Ok(None),
    }
}

/// Asks the store for `ask`, inside a `dlock.acquire` span (lock, backend, kind, fence,
/// outcome) and with the acquire metrics (`dlock_acquire_seconds`, `dlock_wait_seconds`, the
/// `dlock_waiting` gauge): every kind of hold is acquired through here. A call that fails with
/// its outcome unknown gives back what it may have been granted before the error returns.
/// `None` only for [`Ask::All`] on a store with no one-step attempt.
pub(crate) async fn acquire_observed(locks: &Locks, ask: Ask<'_>) -> Option<Result<Granted>> {
    let backend = locks.info().name;
    let started = std::time::Instant::now();
    let (answer, span) = {
        // Counted as waiting while the call runs, however it ends (dropped included).
        let _waiting = Waiting::new(backend);
        match ask {
            Ask::One(request) => {
                let span = acquire_span(backend, request.name.as_str(), request.kind);
                let answer = ask_one(locks, request).instrument(span.clone()).await;
                (answer.map(|lease| lease.map(|lease| vec![lease])), span)
            }
            Ask::All(requests) => {
                // The span follows the answer: a store without the step answers at once, with
                // no I/O, and leaves no empty span behind.
                let answer = ask_all(locks, requests).await?;
                let names: Vec<&str> = requests.iter().map(|r| r.name.as_str()).collect();
                let span = acquire_span(backend, &names.join(","), LockKind::Exclusive);
                (answer, span)
            }
        }
    };
    let outcome = match &answer {
        Ok(Some(_)) => "acquired",
        Ok(None) if !ask.waits() => "busy",
        Ok(None) => "timed_out",
        Err(_) => "error",
    };
    let took = started.elapsed().as_secs_f64();
    let labels = metric_labels(backend, Some(outcome));
    histogram("dlock_acquire_seconds", labels).record(took);
    if ask.waits() {
        histogram("dlock_wait_seconds", labels).record(took);
    }
    span.record("outcome", outcome);
    // A multi-lock's span shows the largest fence, as `Hold::fence` does.
    let fence = match &answer {
        Ok(Some(leases)) => leases.iter().map(|lease| lease.fence()).max(),
        _ => None,
    };
    if let Some(fence) = fence {
        span.record("fence", fence.get());
    }
    Some(answer)
}

fn acquire_span(backend: &'static str, lock: &str, kind: LockKind) -> tracing::Span {
    tracing::info_span!(
        "dlock.acquire",
        lock = %lock,
        backend,
        kind = kind.hold_kind().as_str(),
        fence = tracing::field::Empty,
        outcome = tracing::field::Empty,
    )
}

/// One request. A re-entry runs on a task of its own, and one whose caller was dropped is
/// released as soon as the store answers, so the hold count never stays raised; a first
/// grant relies on [`Backend::acquire`]'s cancel safety, and gives back a grant whose reply
/// was lost.
async fn ask_one(locks: &Locks, request: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
    let store = locks.backend();
    if request.reentrant {
        let (store, request) = (store.clone(), request.clone());
        return crate::lease::detached::run_detached(
            locks.info().name,
            async move { store.acquire(&request).await },
            |lease: Option<Arc<dyn Lease>>| {
                Box::pin(async move {
                    if let Some(lease) = lease {
                        let _ = lease.release().await;
                    }
                })
            },
        )
        .await;
    }
    let answered = store.acquire(request).await;
    if let Err(error) = &answered
        && outcome_unknown(request, error)
    {
        give_back_unknown_grant(store, request).await;
    }
    answered
}

/// Every request in one atomic step, on a task of its own: a caller dropped after the store
/// granted every lock (one script, one transaction) must not leave them held until their
/// leases end. A failure of unknown outcome gives back, name by name, what it may have taken.
async fn ask_all(locks: &Locks, requests: &[AcquireRequest]) -> Option<Result<Granted>> {
    let (store, requests) = (locks.backend().clone(), requests.to_vec());
    let attempt = crate::lease::detached::run_detached(
        locks.info().name,
        async move {
            let outcome = store.try_acquire_all(&requests).await;
            if let Some(Err(error)) = &outcome
                && requests
                    .iter()
                    .all(|request| outcome_unknown(request, error))
            {
                for request in &requests {
                    give_back_by_token(store.as_ref(), request).await;
                }
            }
            Ok(outcome)
        },
        |outcome: Option<Result<Granted>>| {
            Box::pin(async move {
                if let Some(Ok(Some(leases))) = outcome {
                    for lease in leases {
                        let _ = lease.release().await;
                    }
                }
            })
        },
    )
    .await;
    attempt.unwrap_or_else(|error| Some(Err(error)))
}

/// Whether an acquire call that failed with `error` may have left a grant in the store: its
/// last attempt may have reached the store, been granted, and had its reply lost. A retryable
/// error ([`Error::is_retryable`]) says the store could not be heard, so it may have; other
/// errors are answers. A re-entry is never repeated: its token is its hold's, and a repeat
/// would count a second hold.
fn outcome_unknown(request: &AcquireRequest, error: &Error) -> bool {
    error.is_retryable() && !request.reentrant
}

/// Gives back the grant a call that failed with its outcome unknown may have left: one more
/// attempt with the request's own token, without waiting, finds it (or takes the lock fresh
/// where the call never reached the store), and it is released at once, by its token and
/// fence, so no other holder's lock is touched. A busy answer means nothing of this token's
/// is held. The grant is released rather than handed over, since a store's own clean-up of
/// the failed call (by the same token, in the background) may free it at any moment. When
/// the store still cannot be heard, a grant it made ends with its lease.
///
/// # Cancel safety
///
/// A dropped call leaves no hold past its lease ([`Backend::acquire`]'s contract), but may
/// leave one until then: callers run it where the caller cannot cut it short.
async fn give_back_by_token(store: &dyn Backend, request: &AcquireRequest) {
    let mut again = request.clone();
    again.wait = Wait::No;
    match store.acquire(&again).await {
        Ok(Some(lease)) => {
            if let Err(error) = lease.release().await {
                tracing::debug!(%error, "releasing a grant whose reply was lost failed; its lease ends it");
            }
            lease.lost().cancel();
        }
        Ok(None) => {}
        Err(error) => {
            tracing::debug!(%error, "the store still fails after an acquire of unknown outcome; a grant it made ends with its lease");
        }
    }
}

/// [`give_back_by_token`], so that it is not held until its lease ends while every other
/// contender finds the lock busy: awaited, so the lock is free when the call's error reaches
/// its caller, and on a task of its own, so a caller dropped meanwhile does not cut it short.
async fn give_back_unknown_grant(store: &DynBackend, request: &AcquireRequest) {
    let (store, request) = (store.clone(), request.clone());
    let give_back = async move { give_back_by_token(store.as_ref(), &request).await };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let _ = runtime.spawn(give_back).await;
        }
        Err(_) => give_back.await,
    }
}

/// Counts an acquire call in the `dlock_waiting` gauge while it runs.
struct Waiting(&'static str);

impl Waiting {
    fn new(backend: &'static str) -> Waiting {
        gauge("dlock_waiting", metric_labels(backend, None)).increment(1.0);
        Waiting(backend)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        gauge("dlock_waiting", metric_labels(self.0, None)).decrement(1.0);
    }
}

/// What `metrics::histogram!` and `gauge!` give their metrics, for the ones recorded here.
const METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

fn histogram(name: &'static str, labels: &'static [metrics::Label]) -> metrics::Histogram {
    let key = metrics::Key::from_static_parts(name, labels);
    metrics::with_recorder(|recorder| recorder.register_histogram(&key, &METADATA))
}

fn gauge(name: &'static str, labels: &'static [metrics::Label]) -> metrics::Gauge {
    let key = metrics::Key::from_static_parts(name, labels);
    metrics::with_recorder(|recorder| recorder.register_gauge(&key, &METADATA))
}
