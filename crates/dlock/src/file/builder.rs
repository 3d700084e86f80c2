//! [`FileBuilder`]: the folder and options of a [`FileBackend`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::error::from_io;
use super::{FileBackend, FileConfig, Inner};
use crate::backend::local_fs::shared_filesystem_at;
use crate::backend::session::SessionAlarm;
use crate::error::{Error, Result};

/// Builds a [`FileBackend`].
///
/// # Examples
///
/// ```
/// # fn main() -> dlock::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// let backend = dlock::file::FileBuilder::new(dir.path().join("locks"))
///     .create_dirs(true)
///     .build()?;
/// let locks = dlock::Locks::new(backend);
/// # drop(locks);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct FileBuilder {
    config: FileConfig,
}

impl FileBuilder {
    /// A builder for the lock files in `dir` (an absolute path), other options at their
    /// defaults.
    pub fn new(dir: impl Into<PathBuf>) -> FileBuilder {
        FileBuilder {
            config: FileConfig {
                dir: dir.into(),
                ..FileConfig::default()
            },
        }
    }

    /// A builder from a full config.
    pub fn from_config(config: FileConfig) -> FileBuilder {
        FileBuilder { config }
    }

    /// See [`FileConfig::check_interval`].
    pub fn check_interval(mut self, interval: Duration) -> FileBuilder {
        self.config.check_interval = interval;
        self
    }

    /// See [`FileConfig::create_dirs`].
    pub fn create_dirs(mut self, create: bool) -> FileBuilder {
        self.config.create_dirs = create;
        self
    }

    /// The backend, once the folder is checked: it exists (or is created with
    /// `create_dirs`), is a folder, and is on this machine's own filesystem.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a relative path, a missing folder (without
    /// `create_dirs`), a file that is not a folder, or a folder on a network or shared
    /// filesystem (NFS, SMB, 9p, FUSE, …), whose other machines' processes take locks this
    /// kernel does not see; [`Error::PermissionDenied`] where the folder cannot be read.
    pub fn build(self) -> Result<FileBackend> {
        let config = self.config;
        config.validate()?;
        let dir = &config.dir;
        if config.create_dirs {
            std::fs::create_dir_all(dir).map_err(|e| from_io(dir, e))?;
        }
        let refuse = |reason: String| Error::InvalidArgument {
            what: "file folder",
            reason,
        };
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(refuse(format!("{} is not a folder", dir.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(refuse(format!(
                    "{} does not exist (create it, or add ?create_dirs=true)",
                    dir.display()
                )));
            }
            Err(e) => return Err(from_io(dir, e)),
        }
        if let Some(name) = shared_filesystem_at(dir).map_err(|e| from_io(dir, e))? {
            return Err(refuse(format!(
                "{} is on a {name} filesystem: processes of other machines take locks there \
                 that this kernel's flock does not see",
                dir.display()
            )));
        }
        Ok(FileBackend {
            inner: Arc::new(Inner {
                config,
                alarm: SessionAlarm::default(),
            }),
        })
    }
}
