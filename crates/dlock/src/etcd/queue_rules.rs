//! How etcd queues the holds of a lock: the key layout of each kind of hold, and the range
//! reads by create revision that apply the queue rules of `backend::queue_rules` (a waiter
//! watches the key it waits for; etcd reads only the keys a rule needs, not the whole queue).

use etcd_client::{GetOptions, SortOrder, SortTarget};

use crate::backend::LockKind;
use crate::backend::queue_rules::Ahead;
use crate::error::{Error, Result};

use super::error::map;
use super::{Inner, revision};

/// What a queued key waits for.
#[derive(PartialEq, Eq)]
pub(super) enum Wanted {
    /// Nothing: the hold is ours.
    Nothing,
    /// The deletion of this key.
    Key(Vec<u8>),
    /// Any deletion under the lock's base.
    AnyDeletion,
}

/// The start of every key of the lock `name`: `prefix name NUL` for a mutex, and for
/// read-write locks and semaphores `prefix NUL family NUL name NUL`, outside every mutex's range
/// (lock names are never empty and never contain NUL).
pub(super) fn key_base(kind: LockKind, prefix: &str, name: &str) -> Vec<u8> {
    let mut base = Vec::with_capacity(prefix.len() + name.len() + 6);
    base.extend_from_slice(prefix.as_bytes());
    if let Some(family) = kind.family() {
        base.push(0);
        base.extend_from_slice(family.as_bytes());
        base.push(0);
    }
    base.extend_from_slice(name.as_bytes());
    base.push(0);
    base
}

/// What follows the base in a key before the lease id: a read-write lock key's side, or a
/// permit's semaphore size (`n<permits>.`).
fn letter(kind: LockKind) -> Vec<u8> {
    match kind {
        LockKind::Read { .. } => b"r".to_vec(),
        LockKind::Write => b"w".to_vec(),
        LockKind::Exclusive => Vec::new(),
        LockKind::Permit { permits } => format!("n{permits}.").into_bytes(),
    }
}

/// This acquire's key: the base, the side or size, the hold's tag (its lease id, and on the
/// session lease its number there; hex digits and a dot, never a side's or size's letter).
pub(super) fn queue_key(kind: LockKind, base: &[u8], tag: &str) -> Vec<u8> {
    let mut key = base.to_vec();
    key.extend_from_slice(&letter(kind));
    key.extend_from_slice(tag.as_bytes());
    key
}

/// What a key's tail after the base says of its hold, for the queue rules.
pub(super) fn ahead_of(tail: &[u8]) -> Ahead {
    Ahead {
        writer: tail.starts_with(b"w"),
        permit_size: permit_size(tail),
    }
}

/// The semaphore size in a permit key's tail after the base (`n<permits>.<lease id>`).
fn permit_size(tail: &[u8]) -> Option<u32> {
    let tail = tail.strip_prefix(b"n")?;
    let end = tail.iter().position(|&b| b == b'.')?;
    std::str::from_utf8(&tail[..end]).ok()?.parse().ok()
}

fn with_side(base: &[u8], side: &[u8]) -> Vec<u8> {
    let mut prefix = base.to_vec();
    prefix.extend_from_slice(side);
    prefix
}

impl Inner {
    /// Whether the key created at `my_rev` has its turn, else what to watch, with the revision
    /// the answer was read at (a watch starts after it, so no deletion is missed).
    pub(super) async fn wanted(
        &self,
        shape: LockKind,
        base: &[u8],
        my_rev: i64,
    ) -> Result<(Wanted, i64)> {
        let limit = |n: u32| i64::from(n);
        match shape {
            LockKind::Exclusive | LockKind::Write => {
                let (before, at) = self.last_before(base, my_rev).await?;
                Ok((before.map_or(Wanted::Nothing, Wanted::Key), at))
            }
            LockKind::Read { max_readers } => {
                let (writer, at) = self.last_before(&with_side(base, b"w"), my_rev).await?;
                if let Some(writer) = writer {
                    return Ok((Wanted::Key(writer), at));
                }
                let (readers, at) = self
                    .count_before(&with_side(base, b"r"), my_rev, limit(max_readers))
                    .await?;
                if readers < limit(max_readers) {
                    Ok((Wanted::Nothing, at))
                } else {
                    Ok((Wanted::AnyDeletion, at))
                }
            }
            LockKind::Permit { permits } => {
                let (ahead, at) = self.first_before(base, my_rev, limit(permits)).await?;
                // Of two calls with different sizes the later sees the earlier's key.
                if let Some(held_with) = ahead
                    .iter()
                    .filter_map(|key| permit_size(&key[base.len()..]))
                    .find(|&size| size != permits)
                {
                    return Err(Error::SizeMismatch {
                        name: self.name_in(base, shape),
                        asked: permits,
                        held_with,
                    });
                }
                let ahead = i64::try_from(ahead.len()).unwrap_or(i64::MAX);
                if ahead < limit(permits) {
                    Ok((Wanted::Nothing, at))
                } else {
                    Ok((Wanted::AnyDeletion, at))
                }
            }
        }
    }

    /// The key under `prefix` created last before `my_rev`.
    async fn last_before(&self, prefix: &[u8], my_rev: i64) -> Result<(Option<Vec<u8>>, i64)> {
        let (keys, at) = self
            .keys_before(prefix, my_rev, SortOrder::Descend, 1, "predecessor")
            .await?;
        Ok((keys.into_iter().next(), at))
    }

    /// The lock name inside a base made by [`key_base`], for errors.
    fn name_in(&self, base: &[u8], shape: LockKind) -> String {
        let start = key_base(shape, &self.config.prefix, "").len() - 1;
        let name = base.get(start..base.len() - 1).unwrap_or_default();
        String::from_utf8_lossy(name).into_owned()
    }

    /// The first `at_most` keys under `prefix` (oldest first) created before `my_rev`.
    async fn first_before(
        &self,
        prefix: &[u8],
        my_rev: i64,
        at_most: i64,
    ) -> Result<(Vec<Vec<u8>>, i64)> {
        self.keys_before(prefix, my_rev, SortOrder::Ascend, at_most, "permits ahead")
            .await
    }

    /// At most `limit` keys under `prefix` created before `my_rev`, in creation `order`, and
    /// the revision of the read (`what` names it in errors).
    async fn keys_before(
        &self,
        prefix: &[u8],
        my_rev: i64,
        order: SortOrder,
        limit: i64,
        what: &str,
    ) -> Result<(Vec<Vec<u8>>, i64)> {
        let mut reply = self
            .resend(|mut c| async move {
                c.get(
                    prefix,
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_max_create_revision(my_rev - 1)
                            .with_sort(SortTarget::Create, order)
                            .with_limit(limit)
                            .with_keys_only(),
                    ),
                )
                .await
            })
            .await
            .map_err(map)?;
        let at = revision(reply.header(), what)?;
        let keys = reply.take_kvs().into_iter().map(|kv| kv.key().to_vec());
        Ok((keys.collect(), at))
    }

    /// How many keys under `prefix` were created before `my_rev`, counting up to `at_most`.
    async fn count_before(&self, prefix: &[u8], my_rev: i64, at_most: i64) -> Result<(i64, i64)> {
        let (keys, at) = self.first_before(prefix, my_rev, at_most).await?;
        Ok((i64::try_from(keys.len()).unwrap_or(i64::MAX), at))
    }
}
