//! Versioned values: a hash of version and value per name, written by `value_put.lua`.

use async_trait::async_trait;

use super::{RedisBackend, scripts};
use crate::backend::{Expect, ValueStore, Versioned};
use crate::error::{Error, Result};
use crate::name::LockName;

#[async_trait]
impl ValueStore for RedisBackend {
    async fn get(&self, name: &LockName) -> Result<Option<Versioned>> {
        let key = scripts::value_key(&self.inner.config.prefix, name.as_str());
        let mut conn = self.inner.conn();
        let (version, value): (Option<u64>, Option<Vec<u8>>) = ::redis::cmd("HMGET")
            .arg(&key)
            .arg("version")
            .arg("value")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.inner.fail(e, &key))?;
        match (version, value) {
            (Some(version), Some(value)) => Ok(Some(Versioned::new(value, version))),
            (None, None) => Ok(None),
            _ => Err(Error::WrongType {
                backend: "redis",
                key,
                detail: "a hash without dlock's version and value fields".into(),
            }),
        }
    }

    async fn put(&self, name: &LockName, expect: Expect, value: &[u8]) -> Result<Option<u64>> {
        let key = scripts::value_key(&self.inner.config.prefix, name.as_str());
        let (condition, expected) = match expect {
            Expect::Any => ("any", 0),
            Expect::Absent => ("absent", 0),
            Expect::Version(version) => ("version", version),
        };
        let mut conn = self.inner.conn();
        self.inner
            .scripts()
            .value_put
            .key(&key)
            .arg(condition)
            .arg(expected)
            .arg(value)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.inner.fail(e, &key))
    }
}
