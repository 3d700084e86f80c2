//! Holder files: how an acquirer learns at once that the holder of a lock on this machine has
//! died, as `flock(1)` users expect, instead of waiting out its lease.
//!
//! Each client (each `SqliteBackend` built, so two clients of one process are two holders)
//! creates `<db>-holders/<id>` with a random id and keeps an exclusive `flock` on it for its
//! whole life; its lease rows carry the id. The kernel drops the lock when the client closes
//! the file or its process dies, however it dies. An acquirer that finds a lock held under a
//! lease of this boot probes the holder's file with a non-blocking shared `flock`: if it gets
//! it, the holder is gone and its lease may be taken over at once (the fence still grows, as
//! for any takeover). Nothing depends on pids, so a reused pid cannot pass for a holder.
//! `flock`, not `fcntl` locks: those belong to a process, so a client would see a neighbour
//! client of its own process as dead, and closing any descriptor of the file would drop them.
//!
//! The file is opened close-on-exec, so a command a holder runs does not keep it alive; a child
//! forked without exec shares the lock, and keeps a dead parent's holds alive until their
//! lease ends (the safe direction).
//!
//! A missing file proves nothing (it may have been cleaned away under a live holder), so the
//! lease rules apply then; a file is only removed after the rows naming it were freed.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// How a holder file names the clock its leases count on (a boot identity, `clock::boot`).
const BOOT_LINE: &str = "boot ";

/// This client's holder file, locked while it lives.
#[derive(Debug)]
pub(super) struct HolderFile {
    dir: PathBuf,
    id: String,
    _lock: Flock<File>,
}

/// `<db>-holders`, beside the database.
pub(super) fn dir_of(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-holders");
    PathBuf::from(name)
}

/// Refuses a holder directory that someone who cannot write the database could change:
/// whoever can replace a holder's file with an unlocked one makes a live holder look dead. So
/// the directory must be a real directory (not a symlink), have the database's owner, and be
/// writable by group or others only where the database is too.
fn trust(dir: &Path, db: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let (dir_meta, db_meta) = (std::fs::symlink_metadata(dir)?, std::fs::metadata(db)?);
    let refuse = |why: &str| Err(io::Error::other(format!("{}: {why}", dir.display())));
    if !dir_meta.is_dir() {
        return refuse("not a directory (a symlink is refused)");
    }
    if dir_meta.uid() != db_meta.uid() {
        return refuse("owned by another user than the database");
    }
    if dir_meta.mode() & 0o022 & !db_meta.mode() != 0 {
        return refuse("writable by users who cannot write the database");
    }
    Ok(())
}

/// Holder ids are simple UUIDs: anything else read from a row is never used as a file name.
fn valid_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

impl HolderFile {
    /// Creates and locks a new holder file. The file gets its name only once locked (it is
    /// made under a hidden name and renamed), so no prober ever sees it unlocked before its
    /// holder died.
    pub(super) fn create(db: &Path) -> io::Result<HolderFile> {
        let dir = dir_of(db);
        match DirBuilder::new().mode(0o777).create(&dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        trust(&dir, db)?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let hidden = dir.join(format!(".{id}"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&hidden)?;
        let mut lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
            let _ = std::fs::remove_file(&hidden);
            io::Error::from(e)
        })?;
        // Which clock this holder's leases count on, for clients of another one to see
        // (`live_clocks`).
        writeln!(lock, "{BOOT_LINE}{}", super::clock::boot()).inspect_err(|_| {
            let _ = std::fs::remove_file(&hidden);
        })?;
        std::fs::rename(&hidden, dir.join(&id))?;
        Ok(HolderFile {
            dir,
            id,
            _lock: lock,
        })
    }

    pub(super) fn id(&self) -> &str {
        &self.id
    }

    /// Whether the holder `id` is known dead: its file exists and nobody holds its lock.
    pub(super) fn is_dead(&self, id: &str) -> bool {
        id != self.id && valid_id(id) && probe(&self.dir.join(id)) == Some(true)
    }

    /// The holders alive now (their files locked) whose leases count on another clock than
    /// this client's: `(holder id, its boot identity)`. Files of older versions name no clock
    /// and are left out.
    pub(super) fn live_clocks(&self) -> Vec<(String, String)> {
        let own = super::clock::boot();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter(|id| *id != self.id && valid_id(id))
            .filter(|id| probe(&self.dir.join(id)) == Some(false))
            .filter_map(|id| {
                let text = std::fs::read_to_string(self.dir.join(&id)).ok()?;
                let boot = text
                    .lines()
                    .find_map(|l| l.strip_prefix(BOOT_LINE))?
                    .to_owned();
                (boot != own).then_some((id, boot))
            })
            .collect()
    }

    /// Deletes this client's own file: for a client refused at open, which leaves nothing.
    pub(super) fn discard(self) {
        let _ = std::fs::remove_file(self.dir.join(&self.id));
    }

    /// Holder files of this database whose holders died (for the sweep on open).
    pub(super) fn dead_holders(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter(|id| self.is_dead(id))
            .collect()
    }

    /// Deletes a dead holder's file, once the rows naming it were freed. A client's own file
    /// is left when it closes (its lock goes with it): a lease it failed to release is then
    /// still taken over at once, and the next client to open the store deletes the file.
    pub(super) fn remove(&self, id: &str) {
        if valid_id(id) && id != self.id {
            let _ = std::fs::remove_file(self.dir.join(id));
        }
    }
}

/// `Some(true)`: the file's lock is free (its holder is gone); `Some(false)`: held;
/// `None`: the file could not be opened (missing, or not readable).
fn probe(path: &Path) -> Option<bool> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_probe) => Some(true), // unlocked again when `_probe` drops
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Some(false),
        Err(_) => None,
    }
}
