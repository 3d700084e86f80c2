//! [`MemoryBuilder`]: a private store, or the process-wide one of a name.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use super::{MemoryBackend, MemoryConfig};

/// Builds a [`MemoryBackend`].
///
/// # Examples
///
/// ```
/// use dlock::memory::MemoryBuilder;
/// let a = MemoryBuilder::new().name("tests").build();
/// let b = MemoryBuilder::new().name("tests").build();
/// // Same name, same store.
/// assert!(a.same_store(&b));
/// ```
#[derive(Clone, Debug, Default)]
pub struct MemoryBuilder {
    config: MemoryConfig,
}

impl MemoryBuilder {
    /// A builder with default options.
    pub fn new() -> MemoryBuilder {
        MemoryBuilder::default()
    }

    /// A builder from a config.
    pub fn from_config(config: MemoryConfig) -> MemoryBuilder {
        MemoryBuilder { config }
    }

    /// Use the process-wide store named `name`.
    pub fn name(mut self, name: impl Into<String>) -> MemoryBuilder {
        self.config.name = Some(name.into());
        self
    }

    /// The backend.
    pub fn build(self) -> MemoryBackend {
        match self.config.name {
            None => MemoryBackend::new(),
            Some(name) => {
                static NAMED: OnceLock<Mutex<HashMap<String, MemoryBackend>>> = OnceLock::new();
                let mut named = NAMED
                    .get_or_init(Default::default)
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                named.entry(name).or_default().clone()
            }
        }
    }
}
