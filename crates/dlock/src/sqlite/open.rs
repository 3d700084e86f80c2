//! Opening a database: checks that the file is (or can become) dlock's, the two connections
//! of a client, and the WAL checkpoint signal of the inline one.

use std::cell::Cell;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::clock;
use super::config::SqliteConfig;
use super::error::Error;
use super::schema;

/// Opens the worker's and the inline connection. Processes opening a new file at once race to
/// set WAL mode and create the schema, and SQLite reports some of those races as busy without
/// waiting: they are retried until the busy timeout.
pub(super) fn open_both(config: &SqliteConfig) -> Result<(Connection, Connection), Error> {
    // Leases are counted on the machine's monotonic clock of this boot: no statement may run
    // before the boot is known.
    clock::init().map_err(|source| Error::Io {
        path: "the kernel's boot_id (/proc/sys/kernel/random/boot_id)".into(),
        source,
    })?;
    let deadline = std::time::Instant::now() + config.busy_timeout;
    loop {
        let opened = open(config).and_then(|conn| Ok((conn, open_inline(config)?)));
        match opened {
            Err(e) if e.is_busy() && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// The directory of the default store when the user has no state or data directory: in the
/// temp directory, named by the user's id, so users do not share one (see
/// [`crate::default_url`]). Anyone may create it first, so [`trust_temp_store`] checks it.
pub(crate) fn temp_store_dir() -> PathBuf {
    std::env::temp_dir().join(format!("dlock-{}", effective_uid()))
}

fn effective_uid() -> u32 {
    #[allow(unsafe_code)]
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe {
        libc::geteuid()
    }
}

/// The default store's directory in the temp directory, and its database file if there is one,
/// must be this user's and writable by nobody else: a directory (or an empty file) another
/// user made there first would let them read, hold or break this user's locks. Creates the
/// directory, private, when it is missing.
fn trust_temp_store(dir: &Path, file: &Path) -> Result<(), Error> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Io { path, source }
    };
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(dir)(e)),
    }
    let uid = effective_uid();
    // Not followed: a link there is as untrusted as what it points to.
    let checks = [(dir, true), (file, false)];
    for (path, is_dir) in checks {
        let meta = match std::fs::symlink_metadata(path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !is_dir => continue,
            Err(e) => return Err(io(path)(e)),
        };
        let kind_ok = if is_dir {
            meta.file_type().is_dir()
        } else {
            meta.file_type().is_file()
        };
        let detail = if !kind_ok {
            Some(format!(
                "not a plain {}",
                if is_dir { "directory" } else { "file" }
            ))
        } else if meta.uid() != uid {
            Some(format!(
                "owned by uid {}, not by this user (uid {uid})",
                meta.uid()
            ))
        } else if meta.mode() & 0o022 != 0 {
            Some(format!(
                "writable by others (mode {:o})",
                meta.mode() & 0o7777
            ))
        } else {
            None
        };
        if let Some(detail) = detail {
            return Err(Error::Untrusted {
                path: path.to_owned(),
                detail: format!(
                    "{detail}: refused as the default store in the temp directory, where another \
                     user could have made it to read or break this user's locks (remove it, or \
                     name a store with --url or DLOCK_URL)"
                ),
            });
        }
    }
    Ok(())
}

/// Opens the file, refusing anything that is not (or cannot become) a dlock database.
fn open(config: &SqliteConfig) -> Result<Connection, Error> {
    let path = config.path.as_path();
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent()
        && dir == temp_store_dir()
    {
        trust_temp_store(dir, path)?;
    }
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => return Err(Error::IsDirectory(path.to_owned())),
        Ok(meta) => {
            // Open it ourselves first: clearer errors than SQLite's for permissions and garbage.
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(io)?;
            if meta.len() > 0 {
                let mut header = [0u8; 16];
                let read = file.read(&mut header).map_err(io)?;
                if read < 16 || &header != b"SQLite format 3\0" {
                    return Err(Error::NotDlock {
                        path: path.to_owned(),
                        detail: "not a SQLite database".into(),
                    });
                }
                drop(file);
                check_before_writing(path, config.busy_timeout)?;
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
            if let Some(parent) = parent
                && !parent.is_dir()
            {
                if config.create_dirs {
                    // Private to the user: the directory holds who locks what, and a lock file
                    // others can write is a lock others can break. A store shared by several
                    // users lives in a directory made for it.
                    std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(parent)
                        .map_err(io)?;
                } else {
                    return Err(Error::MissingDirectory(parent.to_owned()));
                }
            }
        }
        Err(e) => return Err(io(e)),
    }
    super::one_machine::refuse_shared_filesystem(path)?;
    let sqlite = Error::sqlite;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(path, flags).map_err(sqlite(path))?;
    conn.busy_timeout(config.busy_timeout)
        .map_err(sqlite(path))?;
    let _mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(sqlite(path))?;
    // NORMAL is durable across process crashes in WAL mode, which is what a lock file needs.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sqlite(path))?;
    schema::ensure(&mut conn, path)?;
    Ok(conn)
}

/// Reads an existing database on a read-only connection and refuses it unless it is empty or
/// dlock's, before anything writes to it: switching to WAL mode alone rewrites the header of
/// another application's database for good.
fn check_before_writing(path: &Path, busy_timeout: Duration) -> Result<(), Error> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(Error::sqlite(path))?;
    conn.busy_timeout(busy_timeout)
        .map_err(Error::sqlite(path))?;
    schema::classify(&conn, path).map(|_| ())
}

/// The second connection, for statements run inline on the caller's thread: it never waits
/// for another process's write lock (busy timeout 0: the worker retries those with the real
/// timeout) and never checkpoints (the worker does, in the background), so an inline call is a
/// few microseconds of page-cache work, like a syscall.
fn open_inline(config: &SqliteConfig) -> Result<Connection, Error> {
    let path = config.path.as_path();
    super::one_machine::refuse_shared_filesystem(path)?;
    let sqlite = Error::sqlite;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(sqlite(path))?;
    // Setting up may meet another process creating the file: wait for it like the worker does.
    conn.busy_timeout(config.busy_timeout)
        .map_err(sqlite(path))?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sqlite(path))?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .map_err(sqlite(path))?;
    conn.busy_timeout(Duration::ZERO).map_err(sqlite(path))?;
    conn.wal_hook(Some(note_wal_size));
    Ok(conn)
}

/// WAL size (pages) past which the worker is asked to checkpoint, as SQLite's own
/// auto-checkpoint would (the inline connection has auto-checkpoint off).
const CHECKPOINT_PAGES: std::ffi::c_int = 1000;

thread_local! {
    /// Set by an inline connection's WAL hook when a commit leaves the WAL past
    /// [`CHECKPOINT_PAGES`]. The hook is a plain function, so the mark cannot name its client;
    /// it runs inside the commit on the committing thread, and that client reads the mark on
    /// the same thread right after (see [`take_wal_needs_checkpoint`]). A process-wide mark
    /// let one client take another's (two lock files in one process: one WAL grew unchecked).
    static WAL_NEEDS_CHECKPOINT: Cell<bool> = const { Cell::new(false) };
}

/// Whether the last inline commit on this thread left its WAL due for a checkpoint (and
/// clears the mark).
pub(super) fn take_wal_needs_checkpoint() -> bool {
    WAL_NEEDS_CHECKPOINT.with(|mark| mark.replace(false))
}

fn note_wal_size(_wal: &rusqlite::hooks::Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    if pages >= CHECKPOINT_PAGES {
        WAL_NEEDS_CHECKPOINT.with(|mark| mark.set(true));
    }
    Ok(())
}
