//! The clock SQLite leases run on: one every process of the machine reads alike and that never
//! steps, plus the identity of the boot it counts from.
//!
//! On Linux that is `CLOCK_MONOTONIC` (system-wide, slewed but never stepped by NTP, the clock
//! behind `std::time::Instant` and so behind the lease keeper's own deadlines) and the kernel's
//! random `boot_id`. `CLOCK_BOOTTIME` would keep counting through a suspend while the keeper's
//! clock stops: after a long suspend the store would see a lease as over while its holder still
//! believes it holds, the very gap this clock closes. Monotonic time restarts at each boot, so
//! every lease is stored with the boot it was counted in, and a lease of another boot is over.
//!
//! Elsewhere the wall clock stands in (with a fixed boot identity), as before: leases there
//! are not immune to clock steps.

use std::sync::OnceLock;

static BOOT: OnceLock<String> = OnceLock::new();

/// Reads the boot identity once per process; every open calls it before any statement runs.
#[cfg(target_os = "linux")]
pub(super) fn init() -> std::io::Result<&'static str> {
    if let Some(boot) = BOOT.get() {
        return Ok(boot);
    }
    let read = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    let boot = read.trim();
    if boot.is_empty() {
        return Err(std::io::Error::other("the kernel's boot_id is empty"));
    }
    // A time namespace moves this process's monotonic clock against the machine's: leases
    // counted on it belong to a clock of their own, so the identity says which.
    let identity = match monotonic_offset() {
        Some(offset) => format!("{boot} {MONOTONIC_OFFSET}{offset}"),
        None => boot.to_owned(),
    };
    Ok(BOOT.get_or_init(|| identity))
}

/// What a boot identity carries after the boot id when its clock is a time namespace's.
pub(super) const MONOTONIC_OFFSET: &str = "monotonic offset ";

/// This process's time namespace offset of `CLOCK_MONOTONIC` (`secs.nanos`), when not zero.
/// Kernels without time namespaces have no `timens_offsets`: their clock is the machine's.
#[cfg(target_os = "linux")]
fn monotonic_offset() -> Option<String> {
    let offsets = std::fs::read_to_string("/proc/self/timens_offsets").ok()?;
    offsets.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        if fields.next()? != "monotonic" {
            return None;
        }
        let (secs, nanos): (i64, i64) =
            (fields.next()?.parse().ok()?, fields.next()?.parse().ok()?);
        match (secs, nanos) {
            (0, 0) => None,
            (secs, 0) => Some(format!("{secs}s")),
            (secs, nanos) => Some(format!("{secs}.{nanos:09}s")),
        }
    })
}

#[cfg(not(target_os = "linux"))]
pub(super) fn init() -> std::io::Result<&'static str> {
    Ok(BOOT.get_or_init(|| "wall-clock".to_owned()))
}

/// The boot identity [`init`] read. Statements only run on a connection opened after `init`
/// succeeded, so the empty fallback is never stored.
pub(super) fn boot() -> &'static str {
    BOOT.get().map_or("", String::as_str)
}

/// When the lease keeper (on tokio's clock, which read `start` as `start_std` was read, before
/// the request went to the worker) counts a grant's lease from, for a row written with a
/// [`now_ms`] read just after `granted`. On Linux that is the clock `Instant` reads, so the
/// lease starts at `granted`, less the 2 ms that [`now_ms`] and the TTL's whole milliseconds
/// round off: the keeper's deadline is the row's own, however long the write lock took to
/// get (counted from `start`, a wait longer than the lease ended at once a lease the row
/// still gave). Elsewhere [`now_ms`] is the wall clock, and the lease counts from `start`.
pub(super) fn lease_start(
    start: tokio::time::Instant,
    start_std: std::time::Instant,
    granted: std::time::Instant,
) -> tokio::time::Instant {
    if cfg!(target_os = "linux") {
        let waited = granted.saturating_duration_since(start_std);
        start + waited.saturating_sub(std::time::Duration::from_millis(2))
    } else {
        start
    }
}

/// Milliseconds on the machine's lease clock.
#[cfg(target_os = "linux")]
pub(super) fn now_ms() -> i64 {
    use nix::sys::time::TimeValLike;
    use nix::time::{ClockId, clock_gettime};
    // CLOCK_MONOTONIC cannot fail on Linux; 0 would only make leases look longer-lived.
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |t| t.num_milliseconds())
}

#[cfg(not(target_os = "linux"))]
pub(super) fn now_ms() -> i64 {
    wall_ms()
}

/// Milliseconds since the Unix epoch: only for what is shown (when a hold began), never for
/// whether a lease still runs.
pub(super) fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn the_lease_clock_matches_instant_and_the_boot_is_known() {
        let id = init().unwrap();
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(boot(), id);
        let (a, before) = (now_ms(), std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (b, elapsed) = (now_ms(), before.elapsed());
        let diff = b - a;
        let expected = i64::try_from(elapsed.as_millis()).unwrap();
        assert!((diff - expected).abs() <= 2, "{diff} vs {expected}");
    }
}
