//! How lock nodes are named and queued: name encoding, sequence order, the turn rules of mutexes,
//! readers, writers and permits, and node data.

use std::time::{SystemTime, UNIX_EPOCH};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

use crate::backend::LockKind;
use crate::backend::queue_rules::{Ahead, Decision};
use crate::name::Owner;

use super::{NODE_INFIX, NODE_PREFIX};

/// Bytes a node name keeps as they are: `[A-Za-z0-9._~-]`; every other byte is `%XX`.
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'~')
    .remove(b'.');

/// A lock name as one ZooKeeper node name: bytes outside `[A-Za-z0-9._~-]` as `%XX`, so
/// slashes, spaces and characters ZooKeeper refuses in paths (emoji, controls) all fit, and
/// names differing in case stay distinct. A name of dots only (`.`, `..`) is escaped whole.
pub(super) fn encode_name(name: &str) -> String {
    if name.bytes().all(|b| b == b'.') {
        return "%2E".repeat(name.len());
    }
    utf8_percent_encode(name, ESCAPED).to_string()
}

/// The lock name of a node name made by [`encode_name`]; `None` for one that is not.
pub(super) fn decode_name(node: &str) -> Option<String> {
    percent_decode_str(node)
        .decode_utf8()
        .ok()
        .map(|name| name.into_owned())
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

/// The first letter of a node's tag. Mutex tags are hex, so never `r`, `w` or `p`.
fn tag_letter(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Exclusive => "",
        LockKind::Read { .. } => "r",
        LockKind::Write => "w",
        LockKind::Permit { .. } => "p",
    }
}

/// The directory of the lock: read-write locks and semaphores live beside the mutexes of the
/// same name (a NUL, never part of a lock name, keeps them apart).
pub(super) fn dir_name(kind: LockKind, name: &str) -> String {
    match kind.family() {
        None => name.to_owned(),
        Some(family) => format!("{name}\0{family}"),
    }
}

/// The queue rule of `kind` for the node at `position` of `queue`.
pub(super) fn decide(kind: LockKind, queue: &[(i64, String)], position: usize) -> Decision {
    let ahead: Vec<Ahead> = queue[..position]
        .iter()
        .map(|(_, child)| ahead_of(child))
        .collect();
    kind.decide(&ahead)
}

/// What a queue node's name says of its hold, for the queue rules.
pub(super) fn ahead_of(child: &str) -> Ahead {
    Ahead {
        writer: is_writer(child),
        permit_size: permit_size(child),
    }
}

/// A fresh tag for one acquire call: the kind's letter, a unique id, and for a permit its
/// semaphore's size (`p<uuid>n<permits>`), so every call can check the others'.
pub(super) fn new_tag(kind: LockKind) -> String {
    let id = uuid::Uuid::new_v4().simple();
    match kind {
        LockKind::Permit { permits } => format!("p{id}n{permits}"),
        _ => format!("{}{id}", tag_letter(kind)),
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

pub(super) fn duration_ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How long a lock node's hold lasts, as its data says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Until {
    /// Until this Unix time in milliseconds (the holder's clock): a fixed TTL, kept by the
    /// holder, moved by each extension.
    At(u64),
    /// As long as the holder's session, whose timeout (milliseconds) is the most it outlives
    /// its holder: a watchdog hold. Written `s<ms>`.
    Session(u64),
}

impl std::fmt::Display for Until {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Until::At(ms) => write!(f, "{ms}"),
            Until::Session(ms) => write!(f, "s{ms}"),
        }
    }
}

impl Until {
    /// Reads what [`Display`](std::fmt::Display) wrote.
    pub(super) fn parse(text: &str) -> Option<Until> {
        match text.strip_prefix('s') {
            Some(ms) => ms.parse().ok().map(Until::Session),
            None => text.parse().ok().map(Until::At),
        }
    }
}

/// What a lock node holds, for inspection: when, until when (the holder's clock), who.
pub(super) fn node_data(owner: &Owner, acquired_ms: u64, until: Until) -> Vec<u8> {
    format!(
        "dlock1\0{acquired_ms}\0{until}\0{}\0{}\0{}",
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
