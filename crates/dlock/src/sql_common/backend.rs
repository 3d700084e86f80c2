//! The `Backend`, `ValueStore` and `MonitorStore` of every SQL backend, written once: a
//! backend names its parts (the store of its mode, its values table) and gets the rest.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;

use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Expect, Lease, ListPage, ListQuery, LockInfo,
    MonitorStore, ValueStore, Versioned,
};
use crate::error::Result;
use crate::name::LockName;

use super::{ModeStore, SqlStore};

/// A values table: one conditional statement per write.
#[async_trait]
pub(crate) trait SqlValues: Debug + Send + Sync {
    async fn get(&self, name: &str) -> Result<Option<Versioned>>;
    async fn put(&self, name: &str, expect: Expect, value: &[u8]) -> Result<Option<u64>>;
}

/// What a SQL backend is made of, whatever its database.
#[derive(Debug)]
pub(crate) struct SqlParts<C, L, S, V> {
    pub(crate) config: C,
    pub(crate) store: SqlStore<L, S>,
    pub(crate) values: V,
}

/// A SQL backend: its name, its description per mode and its parts.
pub(crate) trait SqlBackend: Debug + Send + Sync + 'static {
    type Config: Debug + Send + Sync;
    type LeaseTable: ModeStore + MonitorStore;
    type SessionLocks: ModeStore;
    type Values: SqlValues;

    /// The backend's name in errors (`postgres`, `mysql`).
    const NAME: &'static str;

    /// The description in lease mode and in session mode.
    fn infos() -> (&'static BackendInfo, &'static BackendInfo);

    fn parts(&self) -> &SqlParts<Self::Config, Self::LeaseTable, Self::SessionLocks, Self::Values>;
}

#[async_trait]
impl<T: SqlBackend> Backend for T {
    fn info(&self) -> &BackendInfo {
        let (lease, session) = T::infos();
        self.parts().store.info(lease, session)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        crate::ttl::check_store_ttl(req.ttl)?;
        self.parts().store.acquire(req).await
    }

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        self.parts().store.monitor()
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        Some(self)
    }
}

#[async_trait]
impl<T: SqlBackend> ValueStore for T {
    async fn get(&self, name: &LockName) -> Result<Option<Versioned>> {
        self.parts().values.get(name.as_str()).await
    }

    async fn put(&self, name: &LockName, expect: Expect, value: &[u8]) -> Result<Option<u64>> {
        self.parts().values.put(name.as_str(), expect, value).await
    }
}

#[async_trait]
impl<T: SqlBackend> MonitorStore for T {
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.parts().store.inspection(T::NAME)?.inspect(name).await
    }

    async fn list_page(&self, query: ListQuery<'_>) -> Result<ListPage> {
        let store = self.parts().store.inspection(T::NAME)?;
        store.list_page(query).await
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let store = self.parts().store.inspection(T::NAME)?;
        store.force_release(name).await
    }
}
