//! What every composed primitive shares: the lease and wait options, one deadline across all the
//! exclusive locks a primitive takes, and the derived names of those locks.

use std::time::Duration;

use crate::backend::Wait;
use crate::error::{Error, Result};
use crate::locks::Locks;
use crate::mutex::MutexBuilder;
use crate::name::{LockName, MAX_NAME_LEN};
use crate::primitives::ComposedPart;
use crate::ttl::{WaitSpec, validate_max_hold, validate_ttl};

/// The lease and wait setters every composed primitive's builder has (it has an `options:
/// HoldOptions` field); `$what` names what is waited for in the docs.
macro_rules! hold_option_setters {
    ($what:literal) => {
        /// A fixed lease; see [`MutexBuilder::ttl`](crate::MutexBuilder::ttl).
        pub fn ttl(mut self, ttl: std::time::Duration) -> Self {
            self.options.ttl = Some(ttl);
            self
        }

        #[doc = concat!("Waits at most `wait` for ", $what, ".")]
        pub fn wait(mut self, wait: std::time::Duration) -> Self {
            self.options.wait = Some(crate::ttl::WaitSpec::For(wait));
            self
        }

        /// Tries once, without waiting.
        pub fn no_wait(mut self) -> Self {
            self.options.wait = Some(crate::ttl::WaitSpec::No);
            self
        }

        /// Waits as long as it takes (the default of the waiting methods).
        pub fn wait_forever(mut self) -> Self {
            self.options.wait = Some(crate::ttl::WaitSpec::Forever);
            self
        }

        /// With the watchdog: stop renewing `max` after acquisition; see
        /// [`MutexBuilder::max_hold`](crate::MutexBuilder::max_hold).
        pub fn max_hold(mut self, max: std::time::Duration) -> Self {
            self.options.max_hold = Some(max);
            self
        }
    };
}
pub(crate) use hold_option_setters;

/// The lease and wait options of a composed primitive, as set on its builder.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HoldOptions {
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<WaitSpec>,
    pub(crate) max_hold: Option<Duration>,
}

impl HoldOptions {
    /// Checks every option before any store is contacted and fixes the deadline.
    pub(crate) fn start(&self, default_wait: WaitSpec) -> Result<Wait> {
        if let Some(ttl) = self.ttl {
            validate_ttl("ttl", ttl)?;
        }
        validate_max_hold(self.max_hold)?;
        self.wait.unwrap_or(default_wait).to_wait()
    }

    /// A builder for one of the primitive's exclusive locks, waiting until `deadline`.
    pub(crate) fn mutex(&self, locks: &Locks, name: &LockName, deadline: Wait) -> MutexBuilder {
        let mut builder = locks.mutex(name.as_str());
        if let Some(ttl) = self.ttl {
            builder = builder.ttl(ttl);
        }
        if let Some(max) = self.max_hold {
            builder = builder.max_hold(max);
        }
        match deadline.remaining() {
            None => builder.wait_forever(),
            Some(left) if left.is_zero() => builder.no_wait(),
            Some(left) => builder.wait(left),
        }
    }

    /// The wait the caller asked for, for the timeout error.
    pub(crate) fn waited(&self, default_wait: WaitSpec) -> Duration {
        self.wait.unwrap_or(default_wait).duration()
    }
}

/// The name of one of the exclusive locks a primitive is made of: `<name>#<part>`, where
/// `part` is at most [`MAX_PART_SUFFIX`] bytes and `base` came from [`base_name`].
pub(crate) fn part_name(base: &LockName, part: ComposedPart) -> Result<LockName> {
    LockName::new(format!("{base}#{part}"))
}

/// Longest suffix [`part_name`] adds, so builders can check the base once.
pub(crate) const MAX_PART_SUFFIX: usize = 16;

/// Validates a primitive's base name, leaving room for its parts.
pub(crate) fn base_name(name: &str) -> Result<LockName> {
    let base = LockName::new(name)?;
    if base.as_str().len() + MAX_PART_SUFFIX > MAX_NAME_LEN {
        return Err(Error::InvalidName {
            name: name.chars().take(80).collect(),
            reason: "name is too long for this primitive, which adds a suffix of up to 16 bytes (keep it under 496 bytes)",
        });
    }
    Ok(base)
}
