//! The primitive dimension: the mutex cases (areas `mutex`, `lost`, `cancel`, `fence`,
//! `process`) run again on every other kind of hold that must then behave as a mutex
//! (DistributedLock's `TestingSemaphoreAsMutexProvider`, Curator's
//! `TestInterProcessSemaphoreMutex`): a semaphore of one permit, a semaphore of three whose
//! other two permits another client holds, and a read-write lock's write side. The native
//! semaphores and read-write locks (Redis, etcd, ZooKeeper) have acquire, cancel and expiry
//! paths of their own that the mutex cases reach only this way.
//!
//! The other areas stay on the mutex: reentrancy and fair queueing are options of a mutex
//! only (a semaphore or read-write lock has neither), inspection, names, values, retries and
//! multi-locks have their own cases for each primitive or none, and the `semaphore` and
//! `rwlock` areas test what is not mutex-like (several holders, readers).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use dlock::backend::Capabilities;
use dlock::{FencingToken, Locks, MutexGuard, Permit, WriteGuard};

use super::Ctx;

/// The kind of hold a case takes where it would take a mutex.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Primitive {
    /// `locks.mutex(name)`: the cases as written.
    Mutex,
    /// `locks.semaphore(name, 1)`.
    Semaphore1,
    /// `locks.semaphore(name, 3)`, two of its permits held by another client first.
    Semaphore3,
    /// `locks.rwlock(name)`, its write side.
    RwlockWrite,
}

/// Every primitive: what most cases of the dimensioned areas register on.
pub(crate) const EVERY: &[Primitive] = &[
    Primitive::Mutex,
    Primitive::Semaphore1,
    Primitive::Semaphore3,
    Primitive::RwlockWrite,
];

/// The primitives of the cases that cost the most wall time (waiting on the clock through a
/// wait or several TTLs, or many holds): not `semaphore(1)`, which takes the same store path
/// as `semaphore(3)` with fewer permits held; and the others only where the store has them
/// natively ([`registers`]).
pub(crate) const COSTLY: &[Primitive] = &[
    Primitive::Mutex,
    Primitive::Semaphore3,
    Primitive::RwlockWrite,
];

/// The primitives the `dlock` CLI can take (`--permits N`; it has no flag for a write lock).
pub(crate) const CLI: &[Primitive] = &[
    Primitive::Mutex,
    Primitive::Semaphore1,
    Primitive::Semaphore3,
];

/// Only the mutex: cases that need a mutex's own API (inspection and breaking by name, the
/// raw backend request, a multi-lock) or that another area already runs per primitive.
pub(crate) const MUTEX: &[Primitive] = &[Primitive::Mutex];

/// How many permits of a [`Primitive::Semaphore3`] another client holds.
const PRE_TAKEN: u32 = 2;

/// Whether a case that runs `on` these primitives is registered for `primitive` on a store
/// with `caps`. A [`COSTLY`] case is not, for a primitive the store composes of its mutexes:
/// each hold is then several mutexes (a write side 33), which makes it the slowest trial of a
/// run on a SQL store, while the composition itself is the same on every store and its
/// clock-bound behaviour has cases of its own (`semaphore::a_permit_lost_signal_…`,
/// `rwlock::read_and_write_holds_are_kept_while_renewed`).
pub(crate) fn registers(on: &[Primitive], primitive: Primitive, caps: &Capabilities) -> bool {
    let composed = match primitive {
        Primitive::Mutex => false,
        Primitive::Semaphore1 | Primitive::Semaphore3 => !caps.permits,
        Primitive::RwlockWrite => !caps.rwlock,
    };
    on.contains(&primitive) && !(composed && on == COSTLY)
}

impl Primitive {
    /// The trial name segment after the backend (`redis::semaphore1::mutex::…`); none for the
    /// mutex, whose trials keep their names.
    pub fn segment(self) -> Option<&'static str> {
        match self {
            Primitive::Mutex => None,
            Primitive::Semaphore1 => Some("semaphore1"),
            Primitive::Semaphore3 => Some("semaphore3"),
            Primitive::RwlockWrite => Some("rwlock_write"),
        }
    }

    /// The semaphore's size, for a semaphore.
    fn permits(self) -> Option<u32> {
        match self {
            Primitive::Semaphore1 => Some(1),
            Primitive::Semaphore3 => Some(3),
            Primitive::Mutex | Primitive::RwlockWrite => None,
        }
    }

    /// The `dlock run` and `dlock hold` arguments that take this primitive.
    pub(crate) fn cli_args(self) -> Vec<String> {
        match self.permits() {
            Some(n) => vec!["--permits".into(), n.to_string()],
            None => Vec::new(),
        }
    }
}

/// The permits other clients hold for [`Primitive::Semaphore3`], per lock name.
#[derive(Default)]
pub(crate) struct PreTaken {
    client: Option<Locks>,
    permits: HashMap<String, Vec<Permit>>,
}

impl Ctx {
    /// A hold of this case's primitive on `name`, by `locks`: the mutex cases' `locks.mutex(name)`.
    pub(crate) fn lock(&self, locks: &Locks, name: &str) -> Lock {
        Lock {
            cx: self.clone(),
            locks: locks.clone(),
            name: name.to_owned(),
            ttl: None,
            wait: None,
        }
    }

    /// How many rounds a repeating case runs: `mutex` for the mutex, `other` for the other
    /// primitives (their holds cost more on stores that compose them of several locks, and
    /// the mutex's rounds already cover the loop's own logic).
    pub(crate) fn rounds<T>(&self, mutex: T, other: T) -> T {
        if self.primitive == Primitive::Mutex {
            mutex
        } else {
            other
        }
    }

    /// Takes the permits that another client holds of `name` before the case takes it (once
    /// per name; a no-op but for [`Primitive::Semaphore3`]). [`Lock`] does it by itself; a
    /// case whose first hold is taken by another process calls it first.
    pub(crate) async fn pre_take(&self, name: &str) -> anyhow::Result<()> {
        let Primitive::Semaphore3 = self.primitive else {
            return Ok(());
        };
        let mut pre = self.pre_taken.lock().await;
        if pre.permits.contains_key(name) {
            return Ok(());
        }
        let client = match &pre.client {
            Some(client) => client.clone(),
            None => {
                let client = self.locks().await?;
                pre.client = Some(client.clone());
                client
            }
        };
        let mut permits = Vec::new();
        for i in 0..PRE_TAKEN {
            let permit = client
                .semaphore(name, 3)
                .no_wait()
                .acquire()
                .await
                .with_context(|| format!("pre-taking permit {i} of 3 of {name}"))?;
            permits.push(permit);
        }
        pre.permits.insert(name.to_owned(), permits);
        Ok(())
    }

    /// After a case: the pre-taken permits were neither lost nor taken by the case's holds, and
    /// are given back.
    pub(crate) async fn release_pre_taken(&self) -> anyhow::Result<()> {
        let taken: Vec<(String, Vec<Permit>)> =
            self.pre_taken.lock().await.permits.drain().collect();
        for (name, permits) in taken {
            for permit in permits {
                ensure!(
                    !permit.is_lost(),
                    "a permit of {name} that another client held was lost during the case"
                );
                permit
                    .release()
                    .await
                    .with_context(|| format!("releasing a pre-taken permit of {name}"))?;
            }
        }
        Ok(())
    }
}

/// How long a [`Lock`] waits: the builders' `wait` and `no_wait`.
#[derive(Clone, Copy, Debug)]
enum WaitFor {
    At(Duration),
    No,
}

/// The options of one hold of the case's primitive, then its acquisition: a `MutexBuilder`
/// for every primitive.
#[derive(Clone)]
pub(crate) struct Lock {
    cx: Ctx,
    locks: Locks,
    name: String,
    ttl: Option<Duration>,
    wait: Option<WaitFor>,
}

/// The builders' shared option setters, applied to each.
macro_rules! with_options {
    ($builder:expr, $lock:expr) => {{
        let mut builder = $builder;
        if let Some(ttl) = $lock.ttl {
            builder = builder.ttl(ttl);
        }
        match $lock.wait {
            Some(WaitFor::At(wait)) => builder.wait(wait),
            Some(WaitFor::No) => builder.no_wait(),
            None => builder,
        }
    }};
}

impl Lock {
    /// A fixed TTL.
    pub(crate) fn ttl(mut self, ttl: Duration) -> Lock {
        self.ttl = Some(ttl);
        self
    }

    /// Waits at most `wait`.
    pub(crate) fn wait(mut self, wait: Duration) -> Lock {
        self.wait = Some(WaitFor::At(wait));
        self
    }

    /// Does not wait.
    pub(crate) fn no_wait(mut self) -> Lock {
        self.wait = Some(WaitFor::No);
        self
    }

    /// Acquires, as `MutexBuilder::acquire`.
    pub(crate) async fn acquire(self) -> dlock::Result<Held> {
        self.pre_take().await;
        let name = self.name.as_str();
        Ok(match self.cx.primitive {
            Primitive::Mutex => Held::Mutex(
                with_options!(self.locks.mutex(name), self)
                    .acquire()
                    .await?,
            ),
            Primitive::Semaphore1 | Primitive::Semaphore3 => {
                let permits = self.cx.primitive.permits().unwrap_or(1);
                let builder = with_options!(self.locks.semaphore(name, permits), self);
                Held::Permit(builder.acquire().await?)
            }
            Primitive::RwlockWrite => {
                Held::Write(with_options!(self.locks.rwlock(name), self).write().await?)
            }
        })
    }

    /// Acquires if free, as `MutexBuilder::try_acquire`.
    pub(crate) async fn try_acquire(self) -> dlock::Result<Option<Held>> {
        self.pre_take().await;
        let name = self.name.as_str();
        Ok(match self.cx.primitive {
            Primitive::Mutex => with_options!(self.locks.mutex(name), self)
                .try_acquire()
                .await?
                .map(Held::Mutex),
            Primitive::Semaphore1 | Primitive::Semaphore3 => {
                let permits = self.cx.primitive.permits().unwrap_or(1);
                with_options!(self.locks.semaphore(name, permits), self)
                    .try_acquire()
                    .await?
                    .map(Held::Permit)
            }
            Primitive::RwlockWrite => with_options!(self.locks.rwlock(name), self)
                .try_write()
                .await?
                .map(Held::Write),
        })
    }

    /// The other client's permits first. A failure here is the test's set-up failing, not the
    /// store's answer to this hold, so it panics (the case fails) rather than be mistaken for
    /// one (a case expecting `Timeout` must not pass on it).
    async fn pre_take(&self) {
        if let Err(error) = self.cx.pre_take(&self.name).await {
            panic!("{error:#}");
        }
    }
}

/// A hold of any primitive, with the guard methods the mutex cases use.
#[derive(Debug)]
pub(crate) enum Held {
    Mutex(MutexGuard),
    Permit(Permit),
    Write(WriteGuard),
}

/// Forwards a guard method to the guard held.
macro_rules! forward {
    ($self:ident, $guard:ident => $call:expr) => {
        match $self {
            Held::Mutex($guard) => $call,
            Held::Permit($guard) => $call,
            Held::Write($guard) => $call,
        }
    };
}

impl Held {
    pub(crate) fn fence(&self) -> FencingToken {
        forward!(self, g => g.fence())
    }

    pub(crate) fn is_lost(&self) -> bool {
        forward!(self, g => g.is_lost())
    }

    pub(crate) fn lost_token(&self) -> dlock::CancellationToken {
        forward!(self, g => g.lost_token())
    }

    pub(crate) async fn lost(&self) {
        forward!(self, g => g.lost().await)
    }

    pub(crate) async fn extend(&self, ttl: Duration) -> dlock::Result<()> {
        forward!(self, g => g.extend(ttl).await)
    }

    pub(crate) async fn release(self) -> dlock::Result<()> {
        forward!(self, g => g.release().await)
    }
}

/// A contender waiting in a task for the case's primitive: `options` configures the hold; the
/// task ends with its guard (or error).
pub(crate) fn spawn_waiter(
    cx: &Ctx,
    locks: &Locks,
    name: &str,
    options: impl FnOnce(Lock) -> Lock + Send + 'static,
) -> tokio::task::JoinHandle<dlock::Result<Held>> {
    let lock = options(cx.lock(locks, name));
    tokio::spawn(lock.acquire())
}

/// Shared handle of a case's pre-taken permits.
pub(crate) type PreTakenCell = Arc<tokio::sync::Mutex<PreTaken>>;
