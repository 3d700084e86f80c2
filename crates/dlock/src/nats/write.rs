//! The one kind of write every operation is made of: a publish to the key's subject that
//! expects the key's last revision (`Nats-Expected-Last-Subject-Sequence`, 0 for "no entry"),
//! with a per-key TTL (`Nats-TTL`) or as a purge.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::header::{self, HeaderValue};
use async_nats::jetstream::{self, context::PublishErrorKind};
use bytes::Bytes;

use crate::error::Result;

use super::Inner;
use super::builder::MARKER_TTL;
use super::error::map;

/// What a write puts under the key.
#[derive(Clone, Copy, Debug)]
pub(super) enum Head {
    /// A value that lives `ttl` (rounded up to whole seconds, the server's unit).
    Put { ttl: Duration },
    /// A value with no TTL (a versioned value).
    Keep,
    /// A purge: the key's entries go, its marker stays [`MARKER_TTL`].
    Purge,
}

/// The outcome of a write that expects a revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Written {
    /// Written; the key's new revision.
    At(u64),
    /// The key's last revision was another.
    Refused,
}

/// The TTL the server keeps for `ttl`: whole seconds, rounded up, at least one (its
/// smallest).
pub(super) fn ttl_secs(ttl: Duration) -> u64 {
    (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1)
}

/// Writes `value` under `key` of `bucket` if the key's last revision is `expect`.
pub(super) async fn write(
    js: &jetstream::Context,
    bucket: &str,
    key: &str,
    head: Head,
    expect: u64,
    value: Bytes,
) -> Result<Written> {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
        HeaderValue::from(expect),
    );
    match head {
        Head::Put { ttl } => {
            headers.insert(header::NATS_MESSAGE_TTL, HeaderValue::from(ttl_secs(ttl)))
        }
        Head::Keep => {}
        Head::Purge => {
            headers.insert("KV-Operation", "PURGE");
            headers.insert(header::NATS_ROLLUP, "sub");
            headers.insert(
                header::NATS_MESSAGE_TTL,
                HeaderValue::from(ttl_secs(MARKER_TTL)),
            );
        }
    }
    let ack = js
        .publish_with_headers(format!("$KV.{bucket}.{key}"), headers, value)
        .await
        .map_err(map)?;
    match ack.await {
        Ok(ack) => Ok(Written::At(ack.sequence)),
        Err(error) if wrong_last_sequence(&error) => Ok(Written::Refused),
        Err(error) => Err(map(error)),
    }
}

/// Whether the stream refused a write for its expected revision. A single server answers
/// `wrong last sequence: N` (10071), which async-nats names; a clustered stream's leader
/// answers the constant form (10164), which it leaves as `Other`.
fn wrong_last_sequence(error: &jetstream::context::PublishError) -> bool {
    error.kind() == PublishErrorKind::WrongLastSequence
        || std::error::Error::source(error)
            .and_then(|source| source.downcast_ref::<jetstream::Error>())
            .is_some_and(|source| {
                source.error_code() == jetstream::ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT
            })
}

impl Inner {
    /// [`write`] on this client's bucket.
    pub(super) async fn write(
        &self,
        key: &str,
        head: Head,
        expect: u64,
        value: Bytes,
    ) -> Result<Written> {
        write(&self.js, &self.config.bucket, key, head, expect, value).await
    }
}
