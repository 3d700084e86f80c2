//! The blocking coordination primitives: [`Counter`], [`CountDownLatch`], [`Barrier`] (and
//! its [`BarrierGuard`]), [`DoubleBarrier`] (and its [`Inside`]). Their guards release on
//! drop before they return, as every blocking guard does.

use std::sync::Arc;
use std::time::Duration;

use super::Runtime;
use super::held::Held;
use crate::error::Result;
use crate::mutex::MutexGuard;

/// One blocking wrapper per async primitive: the async value and the client's runtime.
macro_rules! blocking_twin {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name {
            inner: crate::$name,
            rt: Arc<Runtime>,
        }
    };
}

impl super::Locks {
    /// Blocking version of [`crate::Locks::counter`].
    ///
    /// # Examples
    ///
    /// ```
    /// let locks = dlock::blocking::Locks::connect("memory://blocking-counter-doc")?;
    /// let visits = locks.counter("visits");
    /// assert_eq!(visits.add(2)?, 2);
    /// assert!(visits.compare_and_set(2, 7)?);
    /// assert_eq!(visits.get()?, 7);
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn counter(&self, name: impl Into<String>) -> Counter {
        Counter {
            inner: self.inner.counter(name),
            rt: self.rt.clone(),
        }
    }

    /// Blocking version of [`crate::Locks::latch`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let locks = dlock::blocking::Locks::connect("memory://blocking-latch-doc")?;
    /// let loaded = locks.latch("loaded");
    /// assert!(loaded.try_set_count(1)?);
    /// let worker = std::thread::spawn({
    ///     let loaded = loaded.clone();
    ///     move || loaded.count_down()
    /// });
    /// loaded.wait(Duration::from_secs(10))?;
    /// assert_eq!(worker.join().unwrap()?, 0);
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn latch(&self, name: impl Into<String>) -> CountDownLatch {
        CountDownLatch {
            inner: self.inner.latch(name),
            rt: self.rt.clone(),
        }
    }

    /// Blocking version of [`crate::Locks::barrier`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let locks = dlock::blocking::Locks::connect("memory://blocking-barrier-doc")?;
    /// let barrier = locks.barrier("release-train");
    /// let raised = barrier.set(Duration::from_secs(1))?;
    /// let waiter = std::thread::spawn({
    ///     let barrier = barrier.clone();
    ///     move || barrier.wait_on(Duration::from_secs(10))
    /// });
    /// raised.remove()?;
    /// waiter.join().unwrap()?;
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn barrier(&self, name: impl Into<String>) -> Barrier {
        Barrier {
            inner: self.inner.barrier(name),
            rt: self.rt.clone(),
        }
    }

    /// Blocking version of [`crate::Locks::double_barrier`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let locks = dlock::blocking::Locks::connect("memory://blocking-double-barrier-doc")?;
    /// let run = |barrier: dlock::blocking::DoubleBarrier| {
    ///     let inside = barrier.enter(Duration::from_secs(10))?;
    ///     inside.leave(Duration::from_secs(10))
    /// };
    /// let other = std::thread::spawn({
    ///     let barrier = locks.double_barrier("pair", 2);
    ///     move || run(barrier)
    /// });
    /// run(locks.double_barrier("pair", 2))?;
    /// other.join().unwrap()?;
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn double_barrier(&self, name: impl Into<String>, participants: u32) -> DoubleBarrier {
        DoubleBarrier {
            inner: self.inner.double_barrier(name, participants),
            rt: self.rt.clone(),
        }
    }
}

blocking_twin!(
    /// Blocking version of [`crate::Counter`].
    Counter
);

impl Counter {
    /// See [`crate::Counter::name`].
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// See [`crate::Counter::max_attempts`].
    pub fn max_attempts(self, attempts: u32) -> Self {
        Counter {
            inner: self.inner.max_attempts(attempts),
            rt: self.rt,
        }
    }

    /// See [`crate::Counter::get`].
    ///
    /// # Errors
    ///
    /// As [`crate::Counter::get`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn get(&self) -> Result<i64> {
        self.rt.block_on(self.inner.get())?
    }

    /// See [`crate::Counter::add`].
    ///
    /// # Errors
    ///
    /// As [`crate::Counter::add`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn add(&self, delta: i64) -> Result<i64> {
        self.rt.block_on(self.inner.add(delta))?
    }

    /// See [`crate::Counter::compare_and_set`].
    ///
    /// # Errors
    ///
    /// As [`crate::Counter::compare_and_set`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn compare_and_set(&self, expected: i64, new: i64) -> Result<bool> {
        self.rt
            .block_on(self.inner.compare_and_set(expected, new))?
    }
}

blocking_twin!(
    /// Blocking version of [`crate::CountDownLatch`].
    CountDownLatch
);

impl CountDownLatch {
    /// See [`crate::CountDownLatch::name`].
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// See [`crate::CountDownLatch::poll_interval`].
    pub fn poll_interval(self, every: Duration) -> Self {
        CountDownLatch {
            inner: self.inner.poll_interval(every),
            rt: self.rt,
        }
    }

    /// See [`crate::CountDownLatch::try_set_count`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::try_set_count`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn try_set_count(&self, count: u64) -> Result<bool> {
        self.rt.block_on(self.inner.try_set_count(count))?
    }

    /// See [`crate::CountDownLatch::count_down`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::count_down`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn count_down(&self) -> Result<u64> {
        self.rt.block_on(self.inner.count_down())?
    }

    /// See [`crate::CountDownLatch::count`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::count`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn count(&self) -> Result<u64> {
        self.rt.block_on(self.inner.count())?
    }

    /// Blocks until the latch is open; see [`crate::CountDownLatch::wait`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::wait`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        self.rt.block_on(self.inner.wait(timeout))?
    }
}

blocking_twin!(
    /// Blocking version of [`crate::Barrier`].
    Barrier
);

impl Barrier {
    /// See [`crate::Barrier::name`].
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// See [`crate::Barrier::ttl`].
    pub fn ttl(self, ttl: Duration) -> Self {
        Barrier {
            inner: self.inner.ttl(ttl),
            rt: self.rt,
        }
    }

    /// See [`crate::Barrier::set`].
    ///
    /// # Errors
    ///
    /// As [`crate::Barrier::set`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn set(&self, timeout: Duration) -> Result<BarrierGuard> {
        let raised = self.rt.block_on(self.inner.set(timeout))??;
        Ok(BarrierGuard {
            held: Held::new(raised.into_hold(), self.rt.clone()),
        })
    }

    /// Blocks while the barrier stands; see [`crate::Barrier::wait_on`].
    ///
    /// # Errors
    ///
    /// As [`crate::Barrier::wait_on`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn wait_on(&self, timeout: Duration) -> Result<()> {
        self.rt.block_on(self.inner.wait_on(timeout))?
    }

    /// See [`crate::Barrier::remove`].
    ///
    /// # Errors
    ///
    /// As [`crate::Barrier::remove`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn remove(&self) -> Result<bool> {
        self.rt.block_on(self.inner.remove())?
    }
}

/// Blocking version of [`crate::BarrierGuard`]. Dropping it removes the barrier.
#[derive(Debug)]
#[must_use = "if unused, the barrier is removed at once"]
pub struct BarrierGuard {
    held: Held<MutexGuard>,
}

impl BarrierGuard {
    /// See [`crate::BarrierGuard::remove`].
    ///
    /// # Errors
    ///
    /// As [`crate::BarrierGuard::remove`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn remove(self) -> Result<()> {
        self.held.release()
    }

    /// See [`crate::BarrierGuard::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }
}

blocking_twin!(
    /// Blocking version of [`crate::DoubleBarrier`].
    DoubleBarrier
);

impl DoubleBarrier {
    /// See [`crate::DoubleBarrier::name`].
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// See [`crate::DoubleBarrier::participants`].
    pub fn participants(&self) -> u32 {
        self.inner.participants()
    }

    /// See [`crate::DoubleBarrier::ttl`].
    pub fn ttl(self, ttl: Duration) -> Self {
        DoubleBarrier {
            inner: self.inner.ttl(ttl),
            rt: self.rt,
        }
    }

    /// See [`crate::DoubleBarrier::poll_interval`].
    pub fn poll_interval(self, every: Duration) -> Self {
        DoubleBarrier {
            inner: self.inner.poll_interval(every),
            rt: self.rt,
        }
    }

    /// Blocks until the round starts; see [`crate::DoubleBarrier::enter`].
    ///
    /// # Errors
    ///
    /// As [`crate::DoubleBarrier::enter`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn enter(&self, timeout: Duration) -> Result<Inside> {
        let inner = self.rt.block_on(self.inner.enter(timeout))??;
        Ok(Inside {
            inner: Some(inner),
            rt: self.rt.clone(),
        })
    }
}

/// Blocking version of [`crate::Inside`]. Dropping it leaves without waiting for the others.
#[derive(Debug)]
#[must_use = "if unused, the participant leaves at once"]
pub struct Inside {
    /// Taken out only by `leave` and `Drop`, which both consume the participant.
    inner: Option<crate::Inside>,
    rt: Arc<Runtime>,
}

impl Inside {
    /// See [`crate::Inside::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.inner.as_ref().is_none_or(crate::Inside::is_lost)
    }

    /// Blocks until every participant has left; see [`crate::Inside::leave`].
    ///
    /// # Errors
    ///
    /// As [`crate::Inside::leave`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn leave(mut self, timeout: Duration) -> Result<()> {
        match self.inner.take() {
            Some(inside) => self.rt.block_on(inside.leave(timeout))?,
            None => Ok(()),
        }
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let Some(inside) = self.inner.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Inside async code we must not block: the presence is released in the background.
            drop(inside);
            return;
        }
        if let Err(error) = self.rt.block_on(inside.drop_out()).and_then(|done| done) {
            tracing::debug!(%error, "leaving a double barrier on drop failed");
        }
    }
}
