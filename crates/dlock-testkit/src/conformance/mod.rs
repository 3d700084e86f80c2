//! The conformance suite: one set of cases, written once as plain async functions over a
//! [`Fixture`], run against every backend and registered by capability.
//!
//! Trials are named `<backend>::<area>::<case>`, so
//! `cargo test -p dlock-rs --test conformance -- sqlite::mutex::` runs one area of one backend.
//! The mutex cases run again on the other primitives ([`Primitive`]), named
//! `<backend>::<primitive>::<area>::<case>` (`redis::semaphore3::fence::…`).
//! A case a backend cannot support is registered as ignored with kind `unsupported` (and
//! fails if forced to run), and the reason is printed in a table before the run; a separate
//! case then checks that the API answers [`dlock::Error::Unsupported`].

mod blocking;
mod cancel;
mod coordination;
mod cross_process;
mod election;
mod fair;
mod fence;
mod fenced;
mod lost;
mod monitor;
mod multi_lock;
mod mutex;
mod names;
mod primitive;
mod reentrant;
mod retry;
mod run_while_held;
mod rwlock;
mod semaphore;
mod values;

use std::sync::Arc;
use std::time::Duration;

use dlock::Locks;
use dlock::backend::Capabilities;
use futures::future::BoxFuture;
use libtest_mimic::{Arguments, Failed, Trial};

use crate::fixture::{Fixture, Starter};

pub use primitive::Primitive;

/// A case fails if it runs longer than this (a hang is a failure, not a stuck CI).
const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// What one case gets: the fixture and a unique name prefix, so all cases can share one store.
#[derive(Clone)]
pub struct Ctx {
    fx: Arc<dyn Fixture>,
    prefix: String,
    primitive: Primitive,
    pre_taken: primitive::PreTakenCell,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("backend", &self.fx.backend())
            .field("prefix", &self.prefix)
            .field("primitive", &self.primitive)
            .finish()
    }
}

impl Ctx {
    /// A new client of the store under test.
    pub async fn locks(&self) -> anyhow::Result<Locks> {
        self.fx.connect().await
    }

    /// A lock name unique to this run of this case.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}/{suffix}", self.prefix)
    }

    /// The backend under test, as its fixture names it (`postgres-session`, …).
    pub fn backend(&self) -> &'static str {
        self.fx.backend()
    }

    /// The kind of hold this run of the case takes where it would take a mutex.
    pub fn primitive(&self) -> Primitive {
        self.primitive
    }

    /// What the suite knows of the store beyond its capabilities.
    pub fn traits(&self) -> crate::fixture::StoreTraits {
        self.fx.traits()
    }

    /// This case's name prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The store's URL for other processes.
    pub fn url(&self) -> anyhow::Result<String> {
        self.fx
            .url()
            .ok_or_else(|| anyhow::anyhow!("{} has no cross-process URL", self.fx.backend()))
    }
}

/// A contender waiting in a task: `builder` configures the acquisition (`.fair()`, `.ttl(..)`,
/// …); the task ends with its guard (or error).
pub(crate) fn spawn_waiter(
    locks: &Locks,
    name: &str,
    builder: impl FnOnce(dlock::MutexBuilder) -> dlock::MutexBuilder + Send + 'static,
) -> tokio::task::JoinHandle<dlock::Result<dlock::MutexGuard>> {
    let acquisition = builder(locks.mutex(name));
    tokio::spawn(acquisition.acquire())
}

/// What a case needs from a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Every backend.
    Any,
    /// Reentrant locks.
    Reentrant,
    /// A backend *without* reentrant locks (to check the unsupported error).
    NotReentrant,
    /// Fair (FIFO) locks.
    Fair,
    /// A backend *without* fair locks (to check the unsupported error).
    NotFair,
    /// Fair locks shared with other processes.
    FairCrossProcess,
    /// Inspection: inspect, force_release.
    Monitor,
    /// Listing by name prefix.
    List,
    /// Inspection without listing (to check the unsupported error).
    MonitorWithoutList,
    /// A backend *without* inspection (to check the unsupported error).
    NotMonitor,
    /// Inspection that counts a lock's waiters: every store with inspection but Redlock,
    /// which keeps no queue (a waiter only listens for releases).
    MonitorWaiters,
    /// Inspection of native semaphores and read-write locks (composed ones are listed as their
    /// parts, which `dlock ls` folds).
    MonitorNativeShared,
    /// Locks visible to other processes, and a URL for them.
    CrossProcess,
    /// Versioned values with compare-and-set.
    Values,
    /// A backend *without* versioned values (to check the unsupported error).
    NotValues,
    /// Fenced writes ([`dlock::VersionedValue::set_fenced`]).
    FencedWrites,
    /// Fenced writes and inspection (a break by `force_release`).
    FencedWritesMonitor,
    /// Fenced writes and a URL for other clients (the blocking facade's).
    FencedWritesCrossProcess,
    /// A backend *without* fenced writes (to check the unsupported error).
    NotFencedWrites,
    /// Inspection and versioned values both (an election's leader with its value).
    MonitorValues,
    /// A repeated attempt with the same token finds its own grant in the store. Not on the
    /// stores whose attempts each hold their own server object (a session connection, an
    /// etcd key under the attempt's lease, a ZooKeeper sequential node): a lost reply there
    /// leaves an object that only its own connection or lease can end.
    RetryFindsItsGrant,
    /// [`Needs::RetryFindsItsGrant`], for the permits of a native semaphore.
    RetryFindsItsPermit,
    /// [`Needs::RetryFindsItsGrant`], for the holds of a native read-write lock.
    RetryFindsItsRwHold,
    /// Semaphores that refuse another size than their holders use: every store's native ones
    /// (the size is in each permit's entry), and composed ones on stores that can list their
    /// slots. Not composed ones on stores without listing (the SQL session modes).
    SemaphoreSize,
}

impl Needs {
    fn unmet(self, caps: &Capabilities, fx: &dyn Fixture) -> Option<&'static str> {
        match self {
            Needs::Any => None,
            Needs::Reentrant => (!caps.reentrant).then_some("no reentrant locks"),
            Needs::NotReentrant => caps.reentrant.then_some("reentrant locks are supported"),
            Needs::Fair => (!caps.fair).then_some("no fair locks"),
            Needs::NotFair => caps.fair.then_some("fair locks are supported"),
            Needs::FairCrossProcess => {
                if !caps.fair {
                    Some("no fair locks")
                } else {
                    Needs::CrossProcess.unmet(caps, fx)
                }
            }
            Needs::SemaphoreSize => (!caps.permits && !caps.list)
                .then_some("composed semaphores cannot list their slots to compare sizes"),
            Needs::Monitor => (!caps.monitor).then_some("no inspection"),
            Needs::NotMonitor => caps.monitor.then_some("inspection is supported"),
            Needs::List => (!caps.list).then_some("no listing"),
            Needs::MonitorWithoutList => {
                (!caps.monitor || caps.list).then_some("not a store that inspects without listing")
            }
            Needs::MonitorWaiters => {
                if fx.traits().counts_waiters {
                    Needs::List.unmet(caps, fx)
                } else {
                    Some("the store keeps no queue of waiters to count")
                }
            }
            Needs::MonitorNativeShared => (!(caps.list && caps.permits && caps.rwlock))
                .then_some("no native semaphores and read-write locks to inspect"),
            Needs::Values => (!caps.values).then_some("no versioned values"),
            Needs::NotValues => caps.values.then_some("versioned values are supported"),
            Needs::FencedWrites => (!caps.fenced_writes).then_some("no fenced writes"),
            Needs::FencedWritesMonitor => Needs::Monitor
                .unmet(caps, fx)
                .or_else(|| Needs::FencedWrites.unmet(caps, fx)),
            Needs::FencedWritesCrossProcess => Needs::CrossProcess
                .unmet(caps, fx)
                .or_else(|| Needs::FencedWrites.unmet(caps, fx)),
            Needs::NotFencedWrites => caps.fenced_writes.then_some("fenced writes are supported"),
            Needs::MonitorValues => Needs::Monitor
                .unmet(caps, fx)
                .or_else(|| Needs::Values.unmet(caps, fx)),
            Needs::CrossProcess => (!caps.cross_process || fx.url().is_none())
                .then_some("locks are local to one process"),
            Needs::RetryFindsItsGrant => {
                (!fx.traits().retry_finds_its_grant).then_some(
                    "each attempt holds its own server object (session, lease key, sequential node): a retry cannot find the earlier grant",
                )
            }
            Needs::RetryFindsItsPermit => Needs::RetryFindsItsGrant
                .unmet(caps, fx)
                .or((!caps.permits).then_some("no native semaphores")),
            Needs::RetryFindsItsRwHold => Needs::RetryFindsItsGrant
                .unmet(caps, fx)
                .or((!caps.rwlock).then_some("no native read-write locks")),
        }
    }
}

type CaseFn = fn(Ctx) -> BoxFuture<'static, anyhow::Result<()>>;

/// One registered case.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// Area: `mutex`, `fence`, `lost`, …
    pub area: &'static str,
    /// Behaviour sentence in snake_case.
    pub name: &'static str,
    /// What the backend must support.
    pub needs: Needs,
    /// The primitives it runs on (once each); most cases, the mutex only.
    pub on: &'static [Primitive],
    /// The case.
    pub run: CaseFn,
}

/// Builds a [`Case`] list: `cases![area, needs => fn_a, fn_b; needs, primitives => fn_c]`,
/// where `primitives` (default: the mutex only) lists the primitives the cases run on.
macro_rules! cases {
    ($area:literal, $($needs:expr $(, $on:expr)? => $($case:ident),+);+ $(;)?) => {
        pub(crate) fn cases() -> Vec<$crate::conformance::Case> {
            [$($crate::conformance::group(
                $area,
                $needs,
                $crate::conformance::cases!(@on $($on)?),
                &[$((stringify!($case), |cx| Box::pin($case(cx))),)+],
            ),)+]
            .concat()
        }
    };
    (@on) => { $crate::conformance::primitive::MUTEX };
    (@on $on:expr) => { $on };
}

/// The cases of one `needs` group of [`cases!`].
pub(crate) fn group(
    area: &'static str,
    needs: Needs,
    on: &'static [Primitive],
    cases: &[(&'static str, CaseFn)],
) -> Vec<Case> {
    cases
        .iter()
        .map(|&(name, run)| Case {
            area,
            name,
            needs,
            on,
            run,
        })
        .collect()
}
pub(crate) use cases;

/// Asserts that a result is the given error variant: `expect_err!(result, Error::NotOwned { .. })`.
macro_rules! expect_err {
    ($result:expr, $pattern:pat) => {
        match $result {
            Err($pattern) => {}
            Err(other) => anyhow::bail!(
                "expected {} but got error {other:?} (line {})",
                stringify!($pattern),
                line!()
            ),
            Ok(_) => anyhow::bail!(
                "expected {} but got Ok (line {})",
                stringify!($pattern),
                line!()
            ),
        }
    };
}
pub(crate) use expect_err;

/// Every case of the suite.
pub fn all_cases() -> Vec<Case> {
    [
        mutex::cases(),
        fence::cases(),
        lost::cases(),
        cancel::cases(),
        reentrant::cases(),
        fair::cases(),
        monitor::cases(),
        names::cases(),
        cross_process::cases(),
        rwlock::cases(),
        semaphore::cases(),
        multi_lock::cases(),
        retry::cases(),
        values::cases(),
        fenced::cases(),
        blocking::cases(),
        election::cases(),
        run_while_held::cases(),
        coordination::cases(),
    ]
    .concat()
}

/// A case skipped for a backend, with the reason.
#[derive(Clone, Debug)]
pub struct Skipped {
    /// The trial name.
    pub trial: String,
    /// Why.
    pub reason: String,
}

/// The trials of every case for one backend, plus the ones it cannot run and why.
pub fn trials(fx: Arc<dyn Fixture>) -> (Vec<Trial>, Vec<Skipped>) {
    let backend = fx.backend();
    let caps = match probe_capabilities(&fx) {
        Ok(caps) => caps,
        Err(error) => {
            let message = format!("{error:#}");
            let trial = Trial::test(format!("{backend}::connect"), move || Err(message.into()));
            return (vec![trial], Vec::new());
        }
    };
    let mut trials = Vec::new();
    let mut skipped = Vec::new();
    for (case, primitive) in case_runs() {
        if !primitive::registers(case.on, primitive, &caps) {
            continue;
        }
        let trial_name = trial_name(backend, &case, primitive);
        if let Some(reason) = case.needs.unmet(&caps, fx.as_ref()) {
            let reason = format!("{backend}: {reason}");
            skipped.push(Skipped {
                trial: trial_name.clone(),
                reason: reason.clone(),
            });
            trials.push(
                Trial::test(trial_name, move || {
                    Err(format!("unsupported: {reason}").into())
                })
                .with_ignored_flag(true)
                .with_kind("unsupported"),
            );
            continue;
        }
        let fx = fx.clone();
        trials.push(Trial::test(trial_name, move || {
            run_case(fx, case, primitive)
        }));
    }
    (trials, skipped)
}

fn probe_capabilities(fx: &Arc<dyn Fixture>) -> anyhow::Result<Capabilities> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async { Ok(fx.connect().await?.info().capabilities) })
}

/// Every case with each primitive it runs on.
fn case_runs() -> impl Iterator<Item = (Case, Primitive)> {
    all_cases()
        .into_iter()
        .flat_map(|case| case.on.iter().map(move |&primitive| (case, primitive)))
}

/// `<backend>::[<primitive>::]<area>::<case>`: the mutex's trials keep their names.
fn trial_name(backend: &str, case: &Case, primitive: Primitive) -> String {
    match primitive.segment() {
        Some(segment) => format!("{backend}::{segment}::{}::{}", case.area, case.name),
        None => format!("{backend}::{}::{}", case.area, case.name),
    }
}

fn run_case(fx: Arc<dyn Fixture>, case: Case, primitive: Primitive) -> Result<(), Failed> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failed::from(e.to_string()))?;
    let cx = Ctx {
        prefix: format!(
            "conformance/{}{}/{}/{}",
            primitive
                .segment()
                .map_or(String::new(), |s| format!("{s}/")),
            case.area,
            case.name,
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ),
        fx,
        primitive,
        pre_taken: Arc::default(),
    };
    let after = cx.clone();
    let outcome = rt.block_on(async {
        tokio::time::timeout(CASE_TIMEOUT, async move {
            (case.run)(cx).await?;
            after.release_pre_taken().await
        })
        .await
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(format!("{error:#}").into()),
        Err(_) => Err(format!("timed out after {CASE_TIMEOUT:?}").into()),
    }
}

/// Runs the suite on `fixtures` as a test binary's `main` (`harness = false`): prints the table
/// of unsupported cases to stderr, runs everything else, exits with libtest's status.
pub fn main(fixtures: Vec<Arc<dyn Fixture>>) -> ! {
    main_with_missing(fixtures, Vec::new())
}

/// [`main`], plus one ignored trial per backend whose server is missing (`(backend, reason)`),
/// so a run without a server reports it as not run instead of saying nothing.
pub fn main_with_missing(fixtures: Vec<Arc<dyn Fixture>>, missing: Vec<(String, String)>) -> ! {
    let args = Arguments::from_args();
    let mut all: Vec<Trial> = missing
        .into_iter()
        .map(|(backend, reason)| {
            Trial::test(format!("{backend}::server_missing"), || Ok(()))
                .with_kind(reason)
                .with_ignored_flag(true)
        })
        .collect();
    let mut skipped = Vec::new();
    for fx in fixtures {
        // Probing a backend starts its servers: not for a listing, nor for a backend whose
        // trials the filter leaves out (scripts/run_tests.py runs one backend per process).
        let names = trial_names(fx.backend());
        if args.list {
            all.extend(names.into_iter().map(|name| Trial::test(name, || Ok(()))));
            continue;
        }
        if !names.iter().any(|name| selected(&args, name)) {
            continue;
        }
        let (trials, skips) = trials(fx);
        all.extend(trials);
        skipped.extend(skips);
    }
    if !skipped.is_empty() && !args.list {
        eprintln!("unsupported (registered as ignored, not counted as passed):");
        for skip in &skipped {
            eprintln!("  skipped: {} — {}", skip.trial, skip.reason);
        }
    }
    libtest_mimic::run(&args, all).exit()
}

/// Every trial name of `backend`'s cases, supported or not.
fn trial_names(backend: &str) -> Vec<String> {
    case_runs()
        .map(|(case, primitive)| trial_name(backend, &case, primitive))
        .collect()
}

/// Runs the suite as a test binary's `main` on every fixture this build has
/// ([`crate::fixture::STARTERS`]), starting only the servers of the backends the filter
/// selects; a backend whose server is missing gets one ignored trial saying so.
pub fn main_enabled() -> ! {
    let args = Arguments::from_args();
    if args.list {
        // Listing starts nothing: the names come from the starters' backend names.
        let built = dlock::enabled_backends();
        let all: Vec<Trial> = crate::fixture::STARTERS
            .iter()
            .filter(|s| built.contains(&s.driver))
            .flat_map(|s| s.backends.iter())
            .flat_map(|backend| trial_names(backend))
            .map(|name| Trial::test(name, || Ok(())))
            .collect();
        libtest_mimic::run(&args, all).exit()
    }
    let wanted = |starter: &Starter| {
        starter.backends.iter().any(|backend| {
            trial_names(backend)
                .iter()
                .any(|name| selected(&args, name))
        })
    };
    let enabled = match crate::fixture::start_enabled(wanted) {
        Ok(enabled) => enabled,
        Err(error) => {
            eprintln!("conformance: could not start the fixtures: {error:#}");
            std::process::exit(101)
        }
    };
    let missing = enabled
        .missing
        .iter()
        .map(|m| (m.backend.to_owned(), format!("{} not installed", m.server)))
        .collect();
    main_with_missing(enabled.fixtures, missing)
}

/// Whether libtest's filter and skip arguments keep the trial `name`.
fn selected(args: &Arguments, name: &str) -> bool {
    let matches = |pattern: &str| {
        if args.exact {
            name == pattern
        } else {
            name.contains(pattern)
        }
    };
    args.filter.as_deref().is_none_or(matches) && !args.skip.iter().any(|skip| matches(skip))
}

/// Polls `fut` up to `polls` times (yielding, then pausing `pause` between polls) and drops it
/// if it has not finished: `None` then. Dropping after a counted number of polls reaches every
/// await point of a fast store, where a timer (at least a millisecond) would come too late.
pub(crate) async fn drop_after_polls<F: std::future::Future>(
    fut: F,
    polls: usize,
    pause: std::time::Duration,
) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    for _ in 0..polls {
        if let std::task::Poll::Ready(out) = futures::poll!(fut.as_mut()) {
            return Some(out);
        }
        tokio::task::yield_now().await;
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    None
}
