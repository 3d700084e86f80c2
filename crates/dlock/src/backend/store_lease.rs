//! The hold of the stores that know it by its lock's name and its owner's token (memory,
//! SQLite, the SQL lease tables): those two, its store and its [`LeaseCore`]. Each store
//! implements [`Lease`](super::Lease) for its own `StoreLease<Store>`.

use std::sync::Arc;

use super::LeaseCore;

/// One hold in store `S`, named by its lock's name and its owner's token.
#[derive(Debug)]
pub(crate) struct StoreLease<S> {
    core: LeaseCore,
    store: Arc<S>,
    name: String,
    token: String,
}

impl<S> StoreLease<S> {
    /// The hold of `name` by `token` in `store`, granted with `core`'s fence.
    pub(crate) fn new(store: Arc<S>, name: String, token: String, core: LeaseCore) -> Self {
        StoreLease {
            core,
            store,
            name,
            token,
        }
    }

    /// The fence, loss signal and start of the hold, for [`Lease::core`](super::Lease::core).
    pub(crate) fn lease_core(&self) -> &LeaseCore {
        &self.core
    }

    /// The store that holds it.
    pub(crate) fn store(&self) -> &S {
        &self.store
    }

    /// The lock's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The owner's token.
    pub(crate) fn token(&self) -> &str {
        &self.token
    }
}
