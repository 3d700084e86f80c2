//! Versioned values, in a map beside the locks.

use async_trait::async_trait;
use std::sync::PoisonError;

use super::MemoryBackend;
use super::store::Store;
use crate::backend::{Expect, ValueStore, Versioned};
use crate::error::Result;
use crate::name::LockName;

#[async_trait]
impl ValueStore for MemoryBackend {
    async fn get(&self, name: &LockName) -> Result<Option<Versioned>> {
        let values = self
            .store
            .values
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(values
            .get(name.as_str())
            .map(|(version, value)| Versioned::new(value.clone(), *version)))
    }

    async fn put(&self, name: &LockName, expect: Expect, value: &[u8]) -> Result<Option<u64>> {
        let mut values = self
            .store
            .values
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = values.get(name.as_str()).map(|(version, _)| *version);
        if !expect.holds(current) {
            return Ok(None);
        }
        let version = current.unwrap_or(0) + 1;
        values.insert(name.as_str().to_owned(), (version, value.to_vec()));
        Ok(Some(version))
    }
}

/// A blind write of `name` in `store` (a fenced write, its hold already checked); the new
/// version.
pub(super) fn write(store: &Store, name: &LockName, value: &[u8]) -> u64 {
    let mut values = store.values.lock().unwrap_or_else(PoisonError::into_inner);
    let version = values.get(name.as_str()).map_or(0, |(version, _)| *version) + 1;
    values.insert(name.as_str().to_owned(), (version, value.to_vec()));
    version
}
