//! Versioned values: one key per name, `prefix + NUL + "value" + NUL + name`, outside every
//! lock's key range (lock names are never empty, so no lock key starts with `prefix + NUL`).
//! The version is the key's `mod_revision`; conditional writes are transactions comparing it.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::backend::{Expect, ValueStore, Versioned};
use crate::error::Result;
use crate::name::LockName;

use super::error::map;
use super::{EtcdBackend, Inner, revision};

fn value_key(prefix: &str, name: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(prefix.len() + name.len() + 7);
    key.extend_from_slice(prefix.as_bytes());
    key.extend_from_slice(b"\0value\0");
    key.extend_from_slice(name.as_bytes());
    key
}

#[async_trait]
impl ValueStore for EtcdBackend {
    async fn get(&self, name: &LockName) -> Result<Option<Versioned>> {
        let key = &value_key(&self.inner.config.prefix, name.as_str());
        let reply = self
            .inner
            .resend(|mut c| async move { c.get(key.as_slice(), None).await })
            .await
            .map_err(map)?;
        Ok(reply.kvs().first().map(|kv| {
            Versioned::new(
                kv.value().to_vec(),
                u64::try_from(kv.mod_revision()).unwrap_or(0),
            )
        }))
    }

    async fn put(&self, name: &LockName, expect: Expect, value: &[u8]) -> Result<Option<u64>> {
        let key = value_key(&self.inner.config.prefix, name.as_str());
        let condition = match expect {
            Expect::Any => None,
            Expect::Absent => Some(Compare::create_revision(key.clone(), CompareOp::Equal, 0)),
            Expect::Version(version) => Some(Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                i64::try_from(version).unwrap_or(i64::MAX),
            )),
        };
        let write = TxnOp::put(key, value.to_vec(), None);
        let txn = match condition {
            Some(condition) => Txn::new().when([condition]).and_then([write]),
            None => Txn::new().and_then([write]),
        };
        let reply = self.inner.txn(txn).await?;
        if !reply.succeeded() {
            return Ok(None);
        }
        // The transaction's revision is the key's new mod_revision.
        let version = revision(reply.header(), "value write")?;
        Ok(Some(u64::try_from(version).unwrap_or(0)))
    }
}

/// A fenced write: `Txn If(the hold's key has its create revision and lease) Then(Put value)`,
/// the check and the write in one transaction. `None` when the hold's key is gone (released,
/// expired with its lease, broken) or is another acquisition's.
pub(super) async fn put_when_held(
    inner: &Inner,
    held: [Compare; 2],
    name: &LockName,
    value: &[u8],
) -> Result<Option<u64>> {
    let key = value_key(&inner.config.prefix, name.as_str());
    let txn = Txn::new()
        .when(held)
        .and_then([TxnOp::put(key, value.to_vec(), None)]);
    let reply = inner.txn(txn).await?;
    if !reply.succeeded() {
        return Ok(None);
    }
    let version = revision(reply.header(), "fenced value write")?;
    Ok(Some(u64::try_from(version).unwrap_or(0)))
}
