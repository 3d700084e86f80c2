//! The bucket's layout: a lock named `N` is the key `lock.E`, a value named `N` the key
//! `value.E`, where `E` is `N` with every byte a KV key cannot hold (anything but letters,
//! digits, `-`, `_` and `/`) written `=XX`; a lock's entry holds its holder's token and fence.

use std::time::Duration;

use bytes::Bytes;

use crate::backend::AcquireRequest;

use super::write::ttl_secs;

/// Version tag of the holder records dlock writes, so a foreign value is recognised.
const TAG: &str = "dlock1";

/// `name` as a KV key token: the bytes a key cannot hold (and `.`, which separates
/// tokens, and `=`, the escape) written `=XX`.
fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'/') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("={byte:02X}"));
        }
    }
    out
}

/// The key of the lock `name`.
pub(super) fn lock_key(name: &str) -> String {
    format!("lock.{}", escape(name))
}

/// The key of the value `name`.
pub(super) fn value_key(name: &str) -> String {
    format!("value.{}", escape(name))
}

/// The lock name of a lock key, for listings (`None` for a key dlock did not write).
pub(super) fn lock_name(key: &str) -> Option<String> {
    let escaped = key.strip_prefix("lock.")?;
    let mut bytes = Vec::with_capacity(escaped.len());
    let mut rest = escaped.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'=' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = tail.get(2..)?;
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// Who holds a lock, as its entry records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Holder {
    pub(super) token: String,
    /// The revision of the grant (renewals write new revisions, the fence stays).
    pub(super) fence: u64,
    pub(super) since_ms: u64,
    /// The TTL of the write that holds the record, in ms (what inspection counts down).
    pub(super) ttl_ms: u64,
    pub(super) host: String,
    pub(super) pid: u32,
    pub(super) label: Option<String>,
}

impl Holder {
    /// The holder `req` is, granted at revision `fence` (0 while unknown: a grant's first
    /// write cannot know its revision, so its fence is the revision it gets).
    pub(super) fn of(req: &AcquireRequest, fence: u64) -> Holder {
        let since_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Holder {
            token: req.token.clone(),
            fence,
            since_ms,
            ttl_ms: 0,
            host: req.owner.host.clone(),
            pid: req.owner.pid,
            label: req.owner.label.clone(),
        }
    }

    /// The record of a write with `ttl` (as the server keeps it: whole seconds).
    pub(super) fn encode(&self, ttl: Duration) -> Bytes {
        let ttl_ms = ttl_secs(ttl).saturating_mul(1000);
        Bytes::from(format!(
            "{TAG}\0{}\0{}\0{}\0{ttl_ms}\0{}\0{}\0{}",
            self.token,
            self.fence,
            self.since_ms,
            self.host,
            self.pid,
            self.label.as_deref().unwrap_or_default()
        ))
    }

    /// Reads a record; `revision` is the entry's, the fence of a record written at grant.
    pub(super) fn decode(value: &[u8], revision: u64) -> Option<Holder> {
        let text = std::str::from_utf8(value).ok()?;
        let mut parts = text.split('\0');
        if parts.next()? != TAG {
            return None;
        }
        let token = parts.next()?.to_owned();
        let fence = parts.next()?.parse::<u64>().ok()?;
        let since_ms = parts.next()?.parse().ok()?;
        let ttl_ms = parts.next()?.parse().ok()?;
        let host = parts.next()?.to_owned();
        let pid = parts.next()?.parse().ok()?;
        let label = parts.next().filter(|l| !l.is_empty()).map(str::to_owned);
        Some(Holder {
            token,
            fence: if fence == 0 { revision } else { fence },
            since_ms,
            ttl_ms,
            host,
            pid,
            label,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_a_valid_key_and_reads_back() {
        let names = [
            "a",
            "orders/42",
            "a.b",
            "a..b",
            ".x.",
            "x=y",
            "ünï cödé *>",
            "a\tb",
        ];
        let keys: std::collections::HashSet<String> = names.iter().map(|n| lock_key(n)).collect();
        assert_eq!(keys.len(), names.len(), "two names share a key");
        for name in names {
            let key = lock_key(name);
            let body = key.strip_prefix("lock.").unwrap();
            assert!(
                body.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_/=".contains(&b)),
                "{key}"
            );
        }
        for name in names {
            assert_eq!(lock_name(&lock_key(name)).as_deref(), Some(name));
        }
        assert_ne!(lock_key("a.b"), lock_key("a=2Eb"));
        assert_ne!(lock_key("x"), value_key("x"));
    }
}
