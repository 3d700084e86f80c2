//! Whether the current thread is a blocking caller: a thread of the user's parked in the
//! [`crate::blocking`] facade's `block_on` (or in a binding's, through
//! `blocking::as_blocking_caller`), polling the lock's future itself. A store may
//! then speak to its server with blocking I/O on this very thread, where its async
//! connection would hand every command to a runtime worker and the reply back (two thread
//! hops per round trip). Runtime workers never carry the mark, so a task spawned from such a
//! call (clean-up, renewals, the keeper) always takes the async path.

use std::cell::Cell;

thread_local! {
    static BLOCKING_CALLER: Cell<bool> = const { Cell::new(false) };
}

/// Whether blocking I/O is allowed on this thread now (see the module's documentation).
// Only the Redis store has a blocking side so far.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn is_blocking_caller() -> bool {
    BLOCKING_CALLER.with(Cell::get)
}

/// Marks this thread a blocking caller until the returned value is dropped (a nested mark
/// restores the outer one).
#[cfg_attr(not(feature = "blocking"), allow(dead_code))]
pub(crate) fn mark_blocking_caller() -> BlockingCallerMark {
    BlockingCallerMark(BLOCKING_CALLER.with(|mark| mark.replace(true)))
}

/// Ends the mark of [`mark_blocking_caller`] when dropped.
pub(crate) struct BlockingCallerMark(bool);

impl Drop for BlockingCallerMark {
    fn drop(&mut self) {
        BLOCKING_CALLER.with(|mark| mark.set(self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_lasts_while_held_and_nests() {
        assert!(!is_blocking_caller());
        let outer = mark_blocking_caller();
        assert!(is_blocking_caller());
        let inner = mark_blocking_caller();
        drop(inner);
        assert!(is_blocking_caller(), "the outer mark still holds");
        drop(outer);
        assert!(!is_blocking_caller());
        std::thread::spawn(|| assert!(!is_blocking_caller(), "another thread is not marked"))
            .join()
            .unwrap();
    }
}
