//! The queue rules of each kind of hold. Every acquire puts one key under its lock's base and
//! waits by create revision; what it waits for depends on the kind (after etcd's own `recipes`
//! and Curator):
//! - a mutex or a writer: no key ahead of it; it watches the key just ahead;
//! - a reader: no writer ahead (so a waiting writer holds back later readers) and fewer than
//!   `max_readers` readers ahead; it watches the nearest writer ahead, or else any deletion;
//! - a permit: fewer than `permits` keys ahead; it watches any deletion. A permit's key
//!   carries its semaphore's size, and a key ahead with another size refuses the call.

use etcd_client::{GetOptions, SortOrder, SortTarget};

use crate::backend::LockKind;
use crate::error::{Error, Result};

use super::error::map;
use super::{Inner, revision};

/// The kind of hold an acquire asks for.
#[derive(Clone, Copy, Debug)]
pub(super) enum Shape {
    Exclusive,
    Read { max_readers: u32 },
    Write,
    Permit { permits: u32 },
}

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

impl Shape {
    pub(super) fn of(kind: LockKind) -> Shape {
        match kind {
            LockKind::Read { max_readers } => Shape::Read { max_readers },
            LockKind::Write => Shape::Write,
            LockKind::Permit { permits } => Shape::Permit { permits },
            _ => Shape::Exclusive,
        }
    }

    /// The start of every key of the lock `name`: `prefix name NUL` for a mutex, and for
    /// read-write locks and semaphores `prefix NUL kind NUL name NUL`, outside every mutex's
    /// range (lock names are never empty and never contain NUL).
    pub(super) fn base(self, prefix: &str, name: &str) -> Vec<u8> {
        let mut base = Vec::with_capacity(prefix.len() + name.len() + 6);
        base.extend_from_slice(prefix.as_bytes());
        match self {
            Shape::Exclusive => {}
            Shape::Read { .. } | Shape::Write => base.extend_from_slice(b"\0rw\0"),
            Shape::Permit { .. } => base.extend_from_slice(b"\0sem\0"),
        }
        base.extend_from_slice(name.as_bytes());
        base.push(0);
        base
    }

    /// What follows the base in a key before the lease id: a read-write lock key's side, or
    /// a permit's semaphore size (`n<permits>.`).
    fn letter(self) -> Vec<u8> {
        match self {
            Shape::Read { .. } => b"r".to_vec(),
            Shape::Write => b"w".to_vec(),
            Shape::Exclusive => Vec::new(),
            Shape::Permit { permits } => format!("n{permits}.").into_bytes(),
        }
    }

    /// This acquire's key: the base, the side or size, the hold's lease id.
    pub(super) fn key(self, base: &[u8], hold: i64) -> Vec<u8> {
        let mut key = base.to_vec();
        key.extend_from_slice(&self.letter());
        key.extend_from_slice(format!("{hold:016x}").as_bytes());
        key
    }

    /// Whether the first key under the base (by create revision) decides the turn alone.
    pub(super) fn first_in_line_wins(self) -> bool {
        matches!(self, Shape::Exclusive | Shape::Write)
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
        shape: Shape,
        base: &[u8],
        my_rev: i64,
    ) -> Result<(Wanted, i64)> {
        let limit = |n: u32| i64::from(n);
        match shape {
            Shape::Exclusive | Shape::Write => {
                let (before, at) = self.last_before(base, my_rev).await?;
                Ok((before.map_or(Wanted::Nothing, Wanted::Key), at))
            }
            Shape::Read { max_readers } => {
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
            Shape::Permit { permits } => {
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
        let mut reply = self
            .resend(|mut c| async move {
                c.get(
                    prefix,
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_max_create_revision(my_rev - 1)
                            .with_sort(SortTarget::Create, SortOrder::Descend)
                            .with_limit(1)
                            .with_keys_only(),
                    ),
                )
                .await
            })
            .await
            .map_err(map)?;
        let at = revision(reply.header(), "predecessor")?;
        Ok((
            reply
                .take_kvs()
                .into_iter()
                .next()
                .map(|kv| kv.key().to_vec()),
            at,
        ))
    }

    /// The lock name inside a base made by [`Shape::base`], for errors.
    fn name_in(&self, base: &[u8], shape: Shape) -> String {
        let start = Shape::base(shape, &self.config.prefix, "").len() - 1;
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
        let mut reply = self
            .resend(|mut c| async move {
                c.get(
                    prefix,
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_max_create_revision(my_rev - 1)
                            .with_sort(SortTarget::Create, SortOrder::Ascend)
                            .with_limit(at_most)
                            .with_keys_only(),
                    ),
                )
                .await
            })
            .await
            .map_err(map)?;
        let at = revision(reply.header(), "permits ahead")?;
        let keys = reply.take_kvs().into_iter().map(|kv| kv.key().to_vec());
        Ok((keys.collect(), at))
    }

    /// How many keys under `prefix` were created before `my_rev`, counting up to `at_most`.
    async fn count_before(&self, prefix: &[u8], my_rev: i64, at_most: i64) -> Result<(i64, i64)> {
        let (keys, at) = self.first_before(prefix, my_rev, at_most).await?;
        Ok((i64::try_from(keys.len()).unwrap_or(i64::MAX), at))
    }
}
