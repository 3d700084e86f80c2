//! What every primitive's builder shares beside the engine's options
//! (`crate::hold::options`): their setters, and the derived names of the exclusive locks a
//! composed primitive is made of.

use crate::error::{Error, Result};
use crate::name::{LockName, MAX_NAME_LEN};
use crate::primitives::ComposedPart;

/// The lease and wait setters every primitive's builder has (it has an `options:
/// HoldOptions` field); `$what` names what is waited for in the docs.
macro_rules! hold_option_setters {
    ($what:literal) => {
        /// A fixed lease; see [`MutexBuilder::ttl`](crate::MutexBuilder::ttl). A hold made of
        /// several store locks gets the whole TTL once it is complete: the parts taken while
        /// the call still waits for others are renewed until then.
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
