//! Limits on lease lengths and waits, checked before anything reaches a store.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Wait;
use crate::error::{Error, Result};

/// The shortest lease accepted: below this no store round trip can renew it in time.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The longest lease accepted (30 days). Longer holds use the watchdog, which renews a short
/// lease for as long as the guard lives.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The lease the watchdog keeps renewing when no TTL is given (Redisson's default too).
pub const DEFAULT_WATCHDOG_LEASE: Duration = Duration::from_secs(30);

/// Checks a lease length against [`MIN_TTL`] and [`MAX_TTL`].
pub(crate) fn validate_ttl(what: &'static str, ttl: Duration) -> Result<Duration> {
    if ttl.is_zero() {
        return Err(Error::invalid_argument(what, "must be greater than zero"));
    }
    if ttl < MIN_TTL {
        return Err(Error::invalid_argument(
            what,
            format!("{ttl:?} is below the minimum of {MIN_TTL:?}"),
        ));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid_argument(
            what,
            format!("{ttl:?} is above the maximum of 30 days; use the watchdog for long holds"),
        ));
    }
    Ok(ttl)
}

/// The check every store makes of a lease length it is handed through the raw
/// [`Backend`](crate::backend::Backend) / [`Lease`](crate::backend::Lease) API, which the
/// builders' own checks stand in front of: at most [`MAX_TTL`] (zero, an extension's
/// ownership check, passes), so no store's deadline arithmetic overflows, nothing panics and
/// no store is asked for a lease it cannot keep.
pub(crate) fn check_store_ttl(ttl: Duration) -> Result<()> {
    if ttl > MAX_TTL {
        return Err(Error::invalid_argument(
            "ttl",
            format!("{ttl:?} is above the maximum of 30 days (dlock::limits::MAX_TTL)"),
        ));
    }
    Ok(())
}

/// Checks a hold's `max_hold`: above zero and within the clock's range. The one check of it,
/// for mutexes and for the primitives built on them.
pub(crate) fn validate_max_hold(max_hold: Option<Duration>) -> Result<()> {
    let Some(max) = max_hold else {
        return Ok(());
    };
    if max.is_zero() {
        return Err(Error::invalid_argument(
            "max_hold",
            "must be greater than zero",
        ));
    }
    Instant::now()
        .checked_add(max)
        .map(|_| ())
        .ok_or_else(|| Error::invalid_argument("max_hold", "overflows the clock"))
}

/// How long a caller is willing to wait, before it is turned into a deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitSpec {
    No,
    For(Duration),
    Forever,
}

impl WaitSpec {
    /// Turns the wait into a deadline on tokio's clock.
    pub(crate) fn to_wait(self) -> Result<Wait> {
        match self {
            WaitSpec::No => Ok(Wait::No),
            WaitSpec::Forever => Ok(Wait::Forever),
            WaitSpec::For(d) if d.is_zero() => Ok(Wait::No),
            WaitSpec::For(d) => Instant::now()
                .checked_add(d)
                .map(Wait::Until)
                .ok_or_else(|| {
                    Error::invalid_argument(
                        "wait",
                        format!(
                            "{d:?} overflows the clock; use the default (wait forever) instead"
                        ),
                    )
                }),
        }
    }

    pub(crate) fn duration(self) -> Duration {
        match self {
            WaitSpec::No => Duration::ZERO,
            WaitSpec::For(d) => d,
            WaitSpec::Forever => Duration::MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_bounds() {
        assert!(validate_ttl("ttl", Duration::ZERO).is_err());
        assert!(validate_ttl("ttl", Duration::from_millis(9)).is_err());
        assert!(validate_ttl("ttl", MIN_TTL).is_ok());
        assert!(validate_ttl("ttl", MAX_TTL).is_ok());
        assert!(validate_ttl("ttl", MAX_TTL + Duration::from_secs(1)).is_err());
        assert!(check_store_ttl(Duration::ZERO).is_ok());
        assert!(check_store_ttl(MAX_TTL).is_ok());
        assert!(check_store_ttl(Duration::MAX).is_err());
    }

    #[tokio::test]
    async fn overflowing_wait_is_an_error() {
        assert!(WaitSpec::For(Duration::MAX).to_wait().is_err());
        assert_eq!(WaitSpec::For(Duration::ZERO).to_wait().unwrap(), Wait::No);
    }
}
