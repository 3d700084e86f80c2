//! The bucket's layout: a lock named `N` is the key `lock.E`, a value named `N` the key
//! `value.E`, where `E` is `N` with every byte a KV key cannot hold (anything but letters,
//! digits, `-`, `_` and `/`) written `=XX`; a lock's entry holds its holder's token and fence.

use bytes::Bytes;

use crate::backend::AcquireRequest;

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

/// Who holds a lock, as its entry records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Holder {
    pub(super) token: String,
    /// The revision of the grant (renewals write new revisions, the fence stays).
    pub(super) fence: u64,
    pub(super) since_ms: u64,
    pub(super) host: String,
    pub(super) pid: u32,
    pub(super) label: Option<String>,
}

impl Holder {
    /// The record of `req`'s hold, granted at revision `fence` (0 while unknown: a grant's
    /// first write cannot know its revision, so its fence is the revision it gets).
    pub(super) fn encode(req: &AcquireRequest, fence: u64) -> Bytes {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Bytes::from(format!(
            "{TAG}\0{}\0{fence}\0{since}\0{}\0{}\0{}",
            req.token,
            req.owner.host,
            req.owner.pid,
            req.owner.label.as_deref().unwrap_or_default()
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
        let host = parts.next()?.to_owned();
        let pid = parts.next()?.parse().ok()?;
        let label = parts.next().filter(|l| !l.is_empty()).map(str::to_owned);
        Some(Holder {
            token,
            fence: if fence == 0 { revision } else { fence },
            since_ms,
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
        assert_ne!(lock_key("a.b"), lock_key("a=2Eb"));
        assert_ne!(lock_key("x"), value_key("x"));
    }
}
