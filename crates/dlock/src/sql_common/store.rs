//! A SQL backend's store in the mode chosen when it was built: the lease table or session
//! locks. The lease table can be inspected and listed; session locks only where the server
//! shows who holds a lock (PostgreSQL), and never listed (the server keeps only hashes).

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;

use crate::backend::{AcquireRequest, BackendInfo, Lease, MonitorStore};
use crate::error::{Error, Result};

/// How one mode's store takes a lock.
#[async_trait]
pub(crate) trait ModeStore: Debug + Send + Sync {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>>;

    /// Inspection of session locks, where the server can show their holders.
    fn session_monitor(&self) -> Option<&dyn MonitorStore> {
        None
    }
}

/// The store of one SQL client: lease table `L` or session locks `S`.
#[derive(Debug)]
pub(crate) enum SqlStore<L, S> {
    Lease(L),
    Session(S),
}

impl<L: ModeStore + MonitorStore, S: ModeStore> SqlStore<L, S> {
    /// The backend's description in this mode: `lease` or `session`.
    pub(crate) fn info(
        &self,
        lease: &'static BackendInfo,
        session: &'static BackendInfo,
    ) -> &'static BackendInfo {
        match self {
            SqlStore::Lease(_) => lease,
            SqlStore::Session(_) => session,
        }
    }

    pub(crate) async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        match self {
            SqlStore::Lease(store) => store.acquire(req).await,
            SqlStore::Session(store) => store.acquire(req).await,
        }
    }

    pub(crate) fn monitor(&self) -> Option<&dyn MonitorStore> {
        match self {
            SqlStore::Lease(store) => Some(store),
            SqlStore::Session(store) => store.session_monitor(),
        }
    }

    /// The store to inspect, for the backend's own `MonitorStore` methods: in session mode
    /// the server keeps nothing to list, so `backend` answers that it is unsupported.
    pub(crate) fn inspection(&self, backend: &'static str) -> Result<&dyn MonitorStore> {
        self.monitor().ok_or(Error::Unsupported {
            operation: "inspection in session mode",
            backend,
        })
    }
}
