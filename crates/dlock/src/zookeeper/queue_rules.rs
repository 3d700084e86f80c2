//! How lock nodes are named and queued: name encoding, sequence order, the turn rules of mutexes,
//! readers, writers and permits, and node data.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::backend::LockKind;
use crate::name::Owner;

use super::{NODE_INFIX, NODE_PREFIX};

/// A lock name as one ZooKeeper node name: bytes outside `[A-Za-z0-9._~-]` as `%XX`, so
/// slashes, spaces and characters ZooKeeper refuses in paths (emoji, controls) all fit, and
/// names differing in case stay distinct.
pub(super) fn encode_name(name: &str) -> String {
    let all_dots = name.bytes().all(|b| b == b'.');
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~') || (b == b'.' && !all_dots)
        {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(super) fn decode_name(node: &str) -> Option<String> {
    let bytes = node.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(node.get(i + 1..i + 3)?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The sequence number of a dlock node name, `None` for anything else.
pub(super) fn sequence(child: &str) -> Option<i64> {
    if !child.starts_with(NODE_PREFIX) {
        return None;
    }
    let (_, seq) = child.rsplit_once(NODE_INFIX)?;
    seq.parse().ok()
}

/// The dlock nodes of a directory in queue order.
pub(super) fn queue(children: Vec<String>) -> Vec<(i64, String)> {
    let mut queue: Vec<(i64, String)> = children
        .into_iter()
        .filter_map(|c| sequence(&c).map(|s| (s, c)))
        .collect();
    queue.sort_unstable();
    queue
}

/// What an acquire call waits for in its directory's queue: the rule of the lock's kind.
#[derive(Clone, Copy, Debug)]
pub(super) enum Turn {
    /// A mutex, or the write side of a read-write lock: first in line.
    Exclusive,
    /// A reader: no writer ahead (so a waiting writer holds back later readers), and fewer
    /// than `max_readers` readers ahead.
    Read { max_readers: u32 },
    /// A writer of a read-write lock: first in line.
    Write,
    /// A permit: among the first `permits` in line.
    Permit { permits: u32 },
}

/// What to do after looking at the queue.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decision {
    Granted,
    /// Wait for the node at this index to go.
    WatchNode(usize),
    /// Wait for any change of the directory.
    WatchChildren,
    /// A semaphore's earlier node asks for another number of permits.
    SizeMismatch {
        asked: u32,
        held_with: u32,
    },
}

impl Turn {
    pub(super) fn of(kind: LockKind) -> Turn {
        match kind {
            LockKind::Read { max_readers } => Turn::Read { max_readers },
            LockKind::Write => Turn::Write,
            LockKind::Permit { permits } => Turn::Permit { permits },
            _ => Turn::Exclusive,
        }
    }

    /// The first letter of a node's tag. Mutex tags are hex, so never `r`, `w` or `p`.
    fn tag_letter(self) -> &'static str {
        match self {
            Turn::Exclusive => "",
            Turn::Read { .. } => "r",
            Turn::Write => "w",
            Turn::Permit { .. } => "p",
        }
    }

    /// The directory of the lock: read-write locks and semaphores live beside the mutexes of
    /// the same name (a NUL, never part of a lock name, keeps them apart).
    pub(super) fn dir_name(self, name: &str) -> String {
        match self {
            Turn::Exclusive => name.to_owned(),
            Turn::Read { .. } | Turn::Write => format!("{name}\0rw"),
            Turn::Permit { .. } => format!("{name}\0sem"),
        }
    }

    pub(super) fn decide(self, queue: &[(i64, String)], position: usize) -> Decision {
        let limit = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        match self {
            Turn::Exclusive | Turn::Write if position == 0 => Decision::Granted,
            Turn::Exclusive | Turn::Write => Decision::WatchNode(position - 1),
            Turn::Read { max_readers } => {
                let writer = queue[..position]
                    .iter()
                    .rposition(|(_, child)| is_writer(child));
                match writer {
                    Some(index) => Decision::WatchNode(index),
                    None if position < limit(max_readers) => Decision::Granted,
                    None => Decision::WatchChildren,
                }
            }
            Turn::Permit { permits } => {
                // Of two calls with different sizes the later sees the earlier's node.
                let other = queue[..position]
                    .iter()
                    .find_map(|(_, child)| permit_size(child).filter(|&size| size != permits));
                match other {
                    Some(held_with) => Decision::SizeMismatch {
                        asked: permits,
                        held_with,
                    },
                    None if position < limit(permits) => Decision::Granted,
                    None => Decision::WatchChildren,
                }
            }
        }
    }

    /// A fresh tag for one acquire call: the kind's letter, a unique id, and for a permit
    /// its semaphore's size (`p<uuid>n<permits>`), so every call can check the others'.
    pub(super) fn new_tag(self) -> String {
        let id = uuid::Uuid::new_v4().simple();
        match self {
            Turn::Permit { permits } => format!("p{id}n{permits}"),
            _ => format!("{}{id}", self.tag_letter()),
        }
    }
}

/// The semaphore size a permit's node carries, if it is a permit node that says.
fn permit_size(child: &str) -> Option<u32> {
    let tag = child.strip_prefix(NODE_PREFIX)?.split(NODE_INFIX).next()?;
    let (_, size) = tag.strip_prefix('p')?.split_once('n')?;
    size.parse().ok()
}

/// Whether a queue node is a read-write lock's writer.
fn is_writer(child: &str) -> bool {
    child
        .strip_prefix(NODE_PREFIX)
        .is_some_and(|tag| tag.starts_with('w'))
}

pub(super) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What a lock node holds, for inspection: when, until when (the holder's clock), who.
pub(super) fn node_data(owner: &Owner, acquired_ms: u64, deadline_ms: u64) -> Vec<u8> {
    format!(
        "dlock1\0{acquired_ms}\0{deadline_ms}\0{}\0{}\0{}",
        owner.pid,
        owner.host,
        owner.label.as_deref().unwrap_or_default()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_keep_prefixes() {
        for name in ["orders/42", "Report", "заказы/🔒 x", ".", "..", "a.b"] {
            let encoded = encode_name(name);
            assert!(!encoded.contains('/'), "{encoded}");
            assert!(encoded != "." && encoded != "..");
            assert_eq!(decode_name(&encoded).as_deref(), Some(name));
        }
        assert!(encode_name("orders/42").starts_with(&encode_name("orders/")));
        assert_ne!(encode_name("Report"), encode_name("report"));
    }

    #[test]
    fn queue_orders_by_sequence_and_ignores_foreign_nodes() {
        let q = queue(vec![
            "_c_b-lock-0000000010".into(),
            "foreign".into(),
            "_c_a-lock-0000000002".into(),
            "_c_c-lock-x".into(),
        ]);
        let seqs: Vec<i64> = q.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, [2, 10]);
    }
}
