//! The limits and defaults dlock enforces, in one place: names, leases, values and the sizes of
//! the primitives. Input beyond a limit is refused with [`Error::InvalidArgument`](crate::Error)
//! before any store is contacted.
//!
//! # Examples
//!
//! ```
//! use dlock::limits::{MAX_NAME_LEN, MIN_TTL};
//! assert_eq!(MAX_NAME_LEN, 512);
//! assert_eq!(MIN_TTL, std::time::Duration::from_millis(10));
//! ```

pub use crate::name::{MAX_LABEL_LEN, MAX_NAME_LEN};
pub use crate::primitives::{DEFAULT_MAX_READERS, MAX_MULTI_LOCK_NAMES, MAX_SLOTS};
pub use crate::ttl::{DEFAULT_WATCHDOG_LEASE, MAX_TTL, MIN_TTL};
pub use crate::value::{DEFAULT_UPDATE_ATTEMPTS, MAX_VALUE_LEN};
