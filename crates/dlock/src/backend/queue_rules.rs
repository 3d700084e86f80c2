//! The queue rules of each kind of hold, for the stores that queue every acquire in order
//! (ZooKeeper by sequence number, etcd by create revision): one definition, exhaustive over
//! [`LockKind`], so a new kind of hold cannot fall back to a wrong rule unnoticed.
//!
//! - a mutex or a writer: first in line; it waits for the entry just ahead;
//! - a reader: no writer ahead (so a waiting writer holds back later readers) and fewer than
//!   `max_readers` readers ahead; it waits for the nearest writer ahead, or else any leave;
//! - a permit: fewer than `permits` entries ahead; it waits for any leave. Every permit entry
//!   carries its semaphore's size, and an entry ahead with another size refuses the call.
// Shared by etcd and ZooKeeper, each using part of it (the full build uses all of it).
#![cfg_attr(not(dlock_all_backends), allow(dead_code, unused_imports))]

use crate::backend::{HoldKind, LockInfo, LockKind};

/// What an entry ahead in the queue is, as far as the rules care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ahead {
    pub(crate) writer: bool,
    /// The semaphore size a permit entry carries.
    pub(crate) permit_size: Option<u32>,
}

/// What an entry does after looking at the queue ahead of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Granted,
    /// Wait for the entry at this index (of those ahead) to leave.
    WaitFor(usize),
    /// Wait for any entry of the lock to leave.
    WaitForAnyLeave,
    /// An earlier permit entry asks for another semaphore size.
    SizeMismatch {
        asked: u32,
        held_with: u32,
    },
}

/// The decisions of each kind of hold, on the one kind type the whole library uses (the
/// request's, the span's label through [`LockKind::hold_kind`], the queue's).
impl LockKind {
    /// The family a lock's entries live in beside the mutexes of the same name: `None` for a
    /// mutex, `rw` for a read-write lock, `sem` for a semaphore.
    pub(crate) fn family(self) -> Option<&'static str> {
        match self {
            LockKind::Exclusive => None,
            LockKind::Read { .. } | LockKind::Write => Some("rw"),
            LockKind::Permit { .. } => Some("sem"),
        }
    }

    /// Whether the entry just ahead decides the turn alone.
    pub(crate) fn first_in_line_wins(self) -> bool {
        matches!(self, LockKind::Exclusive | LockKind::Write)
    }

    /// The rule, over every entry ahead of this one, oldest first.
    pub(crate) fn decide(self, ahead: &[Ahead]) -> Decision {
        let limit = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        match self {
            LockKind::Exclusive | LockKind::Write => match ahead.len() {
                0 => Decision::Granted,
                n => Decision::WaitFor(n - 1),
            },
            LockKind::Read { max_readers } => match ahead.iter().rposition(|a| a.writer) {
                Some(writer) => Decision::WaitFor(writer),
                None if ahead.len() < limit(max_readers) => Decision::Granted,
                None => Decision::WaitForAnyLeave,
            },
            LockKind::Permit { permits } => {
                // Of two calls with different sizes the later sees the earlier's entry.
                let other = ahead
                    .iter()
                    .find_map(|a| a.permit_size.filter(|&size| size != permits));
                match other {
                    Some(held_with) => Decision::SizeMismatch {
                        asked: permits,
                        held_with,
                    },
                    None if ahead.len() < limit(permits) => Decision::Granted,
                    None => Decision::WaitForAnyLeave,
                }
            }
        }
    }
}

impl Ahead {
    /// The hold this entry of a read-write lock's or a semaphore's queue asked for. A reader's
    /// limit is not kept in the stores, so it counts as unlimited here.
    fn shared_kind(self) -> LockKind {
        match (self.writer, self.permit_size) {
            (true, _) => LockKind::Write,
            (false, Some(permits)) => LockKind::Permit { permits },
            (false, None) => LockKind::Read {
                max_readers: u32::MAX,
            },
        }
    }
}

/// How many entries at the head of a read-write lock's or a semaphore's queue (in queue order)
/// hold it now: those the rules grant. Holders are always a head of the queue (a reader
/// behind a writer waits, and so does everyone behind a waiting entry).
pub(crate) fn shared_holders(queue: &[Ahead]) -> usize {
    queue
        .iter()
        .enumerate()
        .take_while(|(at, entry)| entry.shared_kind().decide(&queue[..*at]) == Decision::Granted)
        .count()
}

/// `info` (read from the queue's head) as the entry of a whole semaphore or read-write lock:
/// its kind, how many hold and how many wait behind them. `None` when nobody holds.
pub(crate) fn shared_lock_info(
    info: LockInfo,
    semaphore: bool,
    queue: &[Ahead],
) -> Option<LockInfo> {
    let holders = shared_holders(queue);
    let head = queue.first().filter(|_| holders > 0)?;
    let kind = match (semaphore, head.writer) {
        (true, _) => HoldKind::Permit,
        (false, true) => HoldKind::Writer,
        (false, false) => HoldKind::Reader,
    };
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let mut info = info
        .with_kind(kind)
        .with_waiters(count(queue.len() - holders));
    info.holds = count(holders);
    Some(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_holders_are_the_granted_head_of_the_queue() {
        assert_eq!(shared_holders(&[]), 0);
        assert_eq!(shared_holders(&[READER, READER, WRITER, READER]), 2);
        assert_eq!(shared_holders(&[WRITER, READER]), 1);
        assert_eq!(shared_holders(&[permit(2), permit(2), permit(2)]), 2);
        assert_eq!(shared_holders(&[permit(3)]), 1);
    }

    const MUTEX: Ahead = Ahead {
        writer: false,
        permit_size: None,
    };
    const WRITER: Ahead = Ahead {
        writer: true,
        permit_size: None,
    };
    const READER: Ahead = MUTEX;

    fn permit(size: u32) -> Ahead {
        Ahead {
            writer: false,
            permit_size: Some(size),
        }
    }

    #[test]
    fn exclusive_holds_wait_for_the_entry_just_ahead() {
        assert_eq!(LockKind::Exclusive.decide(&[]), Decision::Granted);
        assert_eq!(
            LockKind::Write.decide(&[MUTEX, MUTEX]),
            Decision::WaitFor(1)
        );
    }

    #[test]
    fn readers_wait_for_the_nearest_writer_and_their_limit() {
        let read = LockKind::Read { max_readers: 2 };
        assert_eq!(read.decide(&[READER]), Decision::Granted);
        assert_eq!(read.decide(&[READER, READER]), Decision::WaitForAnyLeave);
        assert_eq!(
            read.decide(&[WRITER, READER, WRITER, READER]),
            Decision::WaitFor(2)
        );
    }

    #[test]
    fn permits_count_and_check_the_size() {
        let permit3 = LockKind::Permit { permits: 3 };
        assert_eq!(permit3.decide(&[permit(3), permit(3)]), Decision::Granted);
        assert_eq!(
            permit3.decide(&[permit(3), permit(3), permit(3)]),
            Decision::WaitForAnyLeave
        );
        assert_eq!(
            permit3.decide(&[permit(5)]),
            Decision::SizeMismatch {
                asked: 3,
                held_with: 5
            }
        );
    }

    #[test]
    fn every_lock_kind_has_a_rule() {
        for kind in [
            LockKind::Exclusive,
            LockKind::Write,
            LockKind::Read { max_readers: 1 },
            LockKind::Permit { permits: 1 },
        ] {
            assert_eq!(kind.decide(&[]), Decision::Granted, "{kind:?}");
            assert_eq!(
                kind.first_in_line_wins(),
                kind.family() != Some("sem") && !matches!(kind, LockKind::Read { .. })
            );
        }
    }
}
