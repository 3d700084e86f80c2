//! The one kind of read every operation is made of: a key's last entry, answered by the
//! stream's leader when the bucket has replicas.
//!
//! A KV bucket allows direct gets, which any replica answers, and the client uses them: a
//! follower that has not applied the last write yet answers with the entry before it. A lock
//! read right after its grant then looked free (`force_release` found nothing to break, a
//! closed latch looked open: nats-cluster conformance, CI), and a renewal's ownership check
//! could see an older revision. The leader applies a write before it acknowledges it, so a
//! read it answers sees every acknowledged write. One server is its own leader: there the
//! direct get (cheaper for the server) is kept.

use async_nats::jetstream::kv::{self, Entry, Operation};
use async_nats::jetstream::stream::LastRawMessageErrorKind;

use crate::error::Result;

use super::Inner;
use super::error::map;

/// The header a KV write names its operation in (a put when absent).
const KV_OPERATION: &str = "KV-Operation";

/// Whether reads of `kv` must go to its stream's leader: the bucket has replicas.
pub(super) fn leader_reads(kv: &kv::Store) -> bool {
    kv.stream.cached_info().config.num_replicas > 1
}

impl Inner {
    /// The last entry of `key`, `None` when the key has none.
    pub(super) async fn entry(&self, key: &str) -> Result<Option<Entry>> {
        if !self.leader_reads {
            return self.kv.entry(key).await.map_err(map);
        }
        let subject = format!("{}{key}", self.kv.prefix);
        let message = match self
            .kv
            .stream
            .get_last_raw_message_by_subject(&subject)
            .await
        {
            Ok(message) => message,
            Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => {
                return Ok(None);
            }
            Err(error) => return Err(map(error)),
        };
        let operation = operation(&message.headers);
        Ok(Some(Entry {
            bucket: self.kv.name.clone(),
            key: key.to_owned(),
            value: message.payload,
            revision: message.sequence,
            delta: 0,
            created: message.time,
            operation,
            seen_current: false,
        }))
    }
}

/// The operation an entry's headers name, as the KV client reads them: its own header, or the
/// reason of a marker the server left (an expiry or a purge); a put otherwise.
fn operation(headers: &async_nats::HeaderMap) -> Operation {
    if let Some(operation) = headers.get(KV_OPERATION) {
        return operation.as_str().parse().unwrap_or(Operation::Put);
    }
    match headers
        .get(async_nats::header::NATS_MARKER_REASON)
        .map(|reason| reason.as_str())
    {
        Some("MaxAge" | "Purge") => Operation::Purge,
        Some("Remove") => Operation::Delete,
        _ => Operation::Put,
    }
}
