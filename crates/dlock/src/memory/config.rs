//! The memory backend's options.

/// Options of the memory backend.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
#[serde(default)]
pub struct MemoryConfig {
    /// Share the process-wide store of this name (what `memory://NAME` does); `None` makes a
    /// private store. Default: `None`.
    pub name: Option<String>,
}
