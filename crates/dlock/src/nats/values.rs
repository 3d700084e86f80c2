//! Versioned values: one key per name, `value.NAME` (escaped as lock names are), with no TTL.
//! The version is the key's revision; a conditional write expects it.

use async_nats::jetstream::kv::Operation;
use async_trait::async_trait;
use bytes::Bytes;

use crate::backend::{Expect, ValueStore, Versioned};
use crate::error::Result;
use crate::name::LockName;

use super::NatsBackend;
use super::error::map;
use super::keys::value_key;
use super::write::{Head, Written};

#[async_trait]
impl ValueStore for NatsBackend {
    async fn get(&self, name: &LockName) -> Result<Option<Versioned>> {
        let key = value_key(name.as_str());
        let entry = self.inner.entry(&key).await?;
        Ok(entry
            .filter(|entry| entry.operation == Operation::Put)
            .map(|entry| Versioned::new(entry.value.to_vec(), entry.revision)))
    }

    async fn put(&self, name: &LockName, expect: Expect, value: &[u8]) -> Result<Option<u64>> {
        let key = value_key(name.as_str());
        let value = Bytes::copy_from_slice(value);
        let expected = match expect {
            Expect::Any => {
                let revision = self.inner.kv.put(key, value).await.map_err(map)?;
                return Ok(Some(revision));
            }
            // dlock never deletes a value, so "absent" is "never written".
            Expect::Absent => 0,
            Expect::Version(version) => version,
        };
        Ok(
            match self.inner.write(&key, Head::Keep, expected, value).await? {
                Written::At(revision) => Some(revision),
                Written::Refused => None,
            },
        )
    }
}
