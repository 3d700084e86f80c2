//! The file backend's entry in the driver table (`registry.rs`): how `connect` finds it.
//!
//! Its lines of the crate docs, which the build script copies into `lib.rs`
//! (`build/drivers.rs`): rows of the URL table (`url:`) and of `connect`'s (`connect:`), its
//! item in the list of backends (`backend:`, when built) and of cargo features (`feature:`).
//!
//! url: | `file:///ABSOLUTE/DIR` | `flock(2)` on `DIR/NAME`, the lock `flock(1)` and Python's `filelock` take (`file`) | `check_interval`, `create_dirs` |
//! connect: | `file:///ABSOLUTE/DIR` | `file`: `flock` on `DIR/NAME`, shared with `flock(1)` and Python's `filelock` |
//! backend: * [`file`](mod@file): the kernel's `flock` on files of a folder, shared with `flock(1)` and Python's `filelock`.
//! feature: * `file`: the file-lock backend (`flock` on `DIR/NAME`, inotify wake-ups; Linux).

use std::sync::Arc;

use crate::registry::Driver;

pub(crate) const DRIVER: Driver = Driver {
    name: "file",
    feature: Some("file"),
    schemes: super::FILE_SCHEMES,
    capabilities: Some(super::INFO.capabilities),
    connect: |url| {
        Box::pin(async move {
            let config = super::FileConfig::from_url(url)?;
            Ok(Arc::new(super::FileBuilder::from_config(config).build()?) as _)
        })
    },
};
