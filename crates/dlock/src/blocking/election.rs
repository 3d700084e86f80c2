//! The blocking leader election: [`Election`], its [`Leadership`] guard and [`Observe`].

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::Runtime;
use super::held::{Held, blocking_hold_methods};
use crate::election::LeaderStream;
use crate::error::Result;
use crate::fence::FencingToken;
use crate::{Leader, LockName};

impl super::Locks {
    /// Blocking version of [`crate::Locks::election`].
    ///
    /// # Examples
    ///
    /// ```
    /// let locks = dlock::blocking::Locks::connect("memory://blocking-election-doc")?;
    /// let election = locks.election("scheduler");
    /// let leading = election.campaign(b"node-a")?;
    /// assert_eq!(election.leader()?.unwrap().term, leading.term());
    /// leading.proclaim(b"node-a:ready")?;
    /// leading.resign()?;
    /// assert!(election.leader()?.is_none());
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election {
            inner: self.inner.election(name),
            rt: self.rt.clone(),
        }
    }
}

/// Blocking version of [`crate::Election`].
#[derive(Clone, Debug)]
pub struct Election {
    inner: crate::Election,
    rt: Arc<Runtime>,
}

impl Election {
    /// See [`crate::Election::name`].
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// See [`crate::Election::ttl`].
    pub fn ttl(self, ttl: Duration) -> Self {
        Election {
            inner: self.inner.ttl(ttl),
            rt: self.rt,
        }
    }

    /// See [`crate::Election::wait`].
    pub fn wait(self, wait: Duration) -> Self {
        Election {
            inner: self.inner.wait(wait),
            rt: self.rt,
        }
    }

    /// See [`crate::Election::observe_interval`].
    pub fn observe_interval(self, every: Duration) -> Self {
        Election {
            inner: self.inner.observe_interval(every),
            rt: self.rt,
        }
    }

    /// Blocks until elected; see [`crate::Election::campaign`].
    ///
    /// # Errors
    ///
    /// As [`crate::Election::campaign`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn campaign(&self, value: impl AsRef<[u8]>) -> Result<Leadership> {
        let leading = self.rt.block_on(self.inner.campaign(value))??;
        Ok(Leadership {
            held: Held::new(leading, self.rt.clone()),
        })
    }

    /// See [`crate::Election::leader`].
    ///
    /// # Errors
    ///
    /// As [`crate::Election::leader`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn leader(&self) -> Result<Option<Leader>> {
        self.rt.block_on(self.inner.leader())?
    }

    /// The leader's changes as a blocking iterator; see [`crate::Election::observe`].
    pub fn observe(&self) -> Observe {
        Observe {
            stream: self.inner.observe(),
            rt: self.rt.clone(),
        }
    }
}

/// Blocking version of [`LeaderStream`]: each `next` blocks until the leader changes.
pub struct Observe {
    stream: LeaderStream,
    rt: Arc<Runtime>,
}

impl std::fmt::Debug for Observe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observe").finish_non_exhaustive()
    }
}

impl Iterator for Observe {
    type Item = Result<Option<Leader>>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.rt.block_on(self.stream.next()) {
            Ok(item) => item,
            Err(error) => Some(Err(error)),
        }
    }
}

/// Blocking version of [`crate::Leadership`]. Dropping it resigns before returning.
#[derive(Debug)]
#[clippy::has_significant_drop]
#[must_use = "if unused, leadership is given up at once"]
pub struct Leadership {
    held: Held<crate::Leadership>,
}

impl Leadership {
    /// See [`crate::Leadership::name`].
    pub fn name(&self) -> &LockName {
        self.held.get().name()
    }

    /// See [`crate::Leadership::term`].
    pub fn term(&self) -> FencingToken {
        self.held.get().term()
    }

    /// See [`crate::Leadership::value`].
    pub fn value(&self) -> Vec<u8> {
        self.held.get().value()
    }

    /// See [`crate::Leadership::proclaim`].
    ///
    /// # Errors
    ///
    /// As [`crate::Leadership::proclaim`], plus
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside an async runtime.
    pub fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<()> {
        self.held.rt.block_on(self.held.get().proclaim(value))?
    }

    /// See [`crate::Leadership::resign`].
    ///
    /// # Errors
    ///
    /// As [`crate::Leadership::resign`].
    pub fn resign(self) -> Result<()> {
        self.release()
    }

    blocking_hold_methods!("leadership");
}

impl super::held::fenced::Sealed for Leadership {
    fn async_hold(&self) -> &dyn crate::Hold {
        self.held.get()
    }
}
