//! The published value of an election: one versioned value, `<election>#leader`, holding the
//! term that wrote it and the leader's bytes. Every write is a compare-and-set on the version
//! just read, after reading that no later term has published: the record's term never goes
//! back, so a deposed leader cannot overwrite its successor's value, and a reader trusts a
//! record only when its term is the current holder's fence.

use crate::backend::{Expect, ValueStore};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::LockName;
use crate::value::MAX_VALUE_LEN;

/// Marks a record as an election's (and its layout's version), so a foreign value under the
/// same name is a typed error rather than garbage.
const MAGIC: &[u8; 4] = b"dle1";

/// Bytes a record adds to the leader's value: the magic and the term.
const HEADER: usize = MAGIC.len() + 8;

/// The largest value a leader can publish, in bytes: the values' limit less the record's
/// header.
pub const MAX_ELECTION_VALUE_LEN: usize = MAX_VALUE_LEN - HEADER;

/// How many compare-and-set rounds a publish tries before it reports a conflict. Only the
/// leader writes its term's record, so a lost round means a successor published (then the
/// next read says so) or the leader's own two writes raced.
const PUBLISH_ATTEMPTS: u32 = 16;

/// The suffix of the value name that keeps an election's record beside its lock.
const SUFFIX: &str = "#leader";

/// A record as read back: the term that wrote it, its value, and the value's version.
#[derive(Debug)]
pub(crate) struct Record {
    pub(crate) term: FencingToken,
    pub(crate) value: Vec<u8>,
    pub(crate) version: u64,
}

/// The value name of election `name`'s record.
pub(crate) fn record_name(name: &LockName) -> Result<LockName> {
    LockName::new(format!("{}{SUFFIX}", name.as_str()))
}

/// Refuses a value over [`MAX_ELECTION_VALUE_LEN`] before any store call.
pub(crate) fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > MAX_ELECTION_VALUE_LEN {
        return Err(Error::invalid_argument(
            "election value",
            format!("{} bytes; at most {MAX_ELECTION_VALUE_LEN}", value.len()),
        ));
    }
    Ok(())
}

fn encode(term: FencingToken, value: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER + value.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&term.get().to_be_bytes());
    bytes.extend_from_slice(value);
    bytes
}

fn decode(key: &LockName, bytes: &[u8], version: u64, backend: &'static str) -> Result<Record> {
    let wrong = || Error::WrongType {
        backend,
        key: key.as_str().to_owned(),
        detail: "a value that is not an election record".to_owned(),
    };
    let rest = bytes.strip_prefix(MAGIC.as_slice()).ok_or_else(wrong)?;
    let (term, value) = rest.split_at_checked(8).ok_or_else(wrong)?;
    let term = u64::from_be_bytes(term.try_into().map_err(|_| wrong())?);
    Ok(Record {
        term: FencingToken::new(term),
        value: value.to_vec(),
        version,
    })
}

/// The record of `key`, or `None` when no leader ever published.
pub(crate) async fn read(
    values: &dyn ValueStore,
    key: &LockName,
    backend: &'static str,
) -> Result<Option<Record>> {
    match values.get(key).await? {
        Some(read) => decode(key, &read.value, read.version, backend).map(Some),
        None => Ok(None),
    }
}

/// Writes `value` for `term`, unless a later term has published; `still_held` is asked after
/// each read, right before the conditional write, so a leader known to have lost never
/// writes. Returns [`Error::NotOwned`] when a later term published or the hold is gone.
pub(crate) async fn publish<F, Fut>(
    values: &dyn ValueStore,
    key: &LockName,
    backend: &'static str,
    term: FencingToken,
    value: &[u8],
    still_held: F,
) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let bytes = encode(term, value);
    for _ in 0..PUBLISH_ATTEMPTS {
        let current = read(values, key, backend).await?;
        if current.as_ref().is_some_and(|record| record.term > term) || !still_held().await? {
            return Err(Error::not_owned(key.as_str()));
        }
        let expect = Expect::from_read(current.map(|record| record.version));
        if values.put(key, expect, &bytes).await?.is_some() {
            return Ok(());
        }
    }
    Err(Error::Conflict {
        name: key.as_str().to_owned(),
        attempts: PUBLISH_ATTEMPTS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let key = LockName::new("e#leader").unwrap();
        let bytes = encode(FencingToken::new(42), b"node-a");
        let record = decode(&key, &bytes, 7, "memory").unwrap();
        assert_eq!(record.term, FencingToken::new(42));
        assert_eq!(record.value, b"node-a");
        assert_eq!(record.version, 7);
    }

    #[test]
    fn a_foreign_value_is_a_wrong_type() {
        let key = LockName::new("e#leader").unwrap();
        for bytes in [&b""[..], b"dle1", b"dle1short", b"xxxx12345678"] {
            assert!(matches!(
                decode(&key, bytes, 1, "memory"),
                Err(Error::WrongType { .. })
            ));
        }
    }
}
