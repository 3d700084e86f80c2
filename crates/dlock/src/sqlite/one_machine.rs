//! A SQLite store is for the processes of one machine, on one clock: its leases are counted on
//! that machine's monotonic clock and a dead holder is seen by its `flock`. What would break
//! that silently is refused when a client opens the store:
//!
//! - a database on a network or shared filesystem (NFS, SMB, 9p, FUSE, …), where another
//!   kernel's processes may write it, with clocks and locks of their own;
//! - a live client of another boot or another time namespace (its holder file is locked and
//!   names another clock): counted on this client's clock, its leases would end at the wrong
//!   time, and a live hold could be taken over.

use std::path::Path;

use super::clock::{self, MONOTONIC_OFFSET};
use super::error::Error;
use super::holders::HolderFile;
use crate::backend::local_fs::shared_filesystem_at;

/// Refuses a database whose folder is on a network or shared filesystem.
pub(super) fn refuse_shared_filesystem(db: &Path) -> Result<(), Error> {
    let dir = db
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let shared = shared_filesystem_at(dir).map_err(|e| Error::Io {
        path: dir.to_owned(),
        source: e,
    })?;
    match shared {
        None => Ok(()),
        Some(name) => Err(Error::NotOneMachine {
            path: db.to_owned(),
            detail: format!(
                "on a {name} filesystem, which processes of other machines can write, with \
                 clocks and locks of their own"
            ),
        }),
    }
}

/// Refuses to open the store while a client of another boot or time namespace is alive on it.
/// Called once this client's own holder file exists, so of two clients opening at once at
/// least one sees the other.
pub(super) fn refuse_foreign_clients(db: &Path, holder: &HolderFile) -> Result<(), Error> {
    let Some((id, theirs)) = holder.live_clocks().into_iter().next() else {
        return Ok(());
    };
    let ours = clock::boot();
    let boot_of = |identity: &str| identity.split(' ').next().unwrap_or_default().to_owned();
    let offset_of = |identity: &str| {
        identity
            .split_once(MONOTONIC_OFFSET)
            .map_or("0s".to_owned(), |(_, offset)| offset.to_owned())
    };
    let what = if boot_of(&theirs) == boot_of(ours) {
        format!(
            "a client in another time namespace (holder {id}: its monotonic clock is offset by \
             {}, this client's by {})",
            offset_of(&theirs),
            offset_of(ours)
        )
    } else {
        format!(
            "a client of another boot (holder {id}, boot {}; this is boot {}): another kernel \
             shares this folder",
            boot_of(&theirs),
            boot_of(ours)
        )
    };
    Err(Error::NotOneMachine {
        path: db.to_owned(),
        detail: format!(
            "in use by {what}; its leases count on another clock than this client's, so \
             neither could trust the other's"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_on_a_local_filesystem_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        refuse_shared_filesystem(&dir.path().join("locks.db")).unwrap();
    }
}
