//! Versioned values, one file each under `DIR/.dlock/values/`: a header with the version, then
//! the bytes. A write locks the current file, checks the version, and replaces the file by
//! renaming a flushed new one over it, so a reader (which takes no lock) sees the old value
//! or the new one whole, and a crash leaves one of them.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use nix::fcntl::{Flock, FlockArg};

use super::error::{from_io, thread_gone};
use super::lock_file::is_at;
use super::{FileBackend, paths};
use crate::backend::{Expect, ValueStore, Versioned};
use crate::error::{Error, Result};
use crate::name::LockName;

/// The first line of a value file, before its version.
const HEADER: &str = "dlock-value 1 ";

/// The value file of `name`, relative to the folder.
fn value_file(name: &LockName) -> Result<PathBuf> {
    paths::lock_path(name.as_str())
        .map(|path| paths::value_path(&path))
        .map_err(|reason| Error::InvalidName {
            name: name.as_str().chars().take(80).collect(),
            reason,
        })
}

/// The version and bytes of a value file's contents; `None` for an empty file (one made by a
/// write that found no value and wrote none).
fn parse(contents: &[u8]) -> std::io::Result<Option<Versioned>> {
    if contents.is_empty() {
        return Ok(None);
    }
    let bad = || std::io::Error::new(ErrorKind::InvalidData, "not a dlock value file");
    let newline = contents.iter().position(|b| *b == b'\n').ok_or_else(bad)?;
    let version = std::str::from_utf8(&contents[..newline])
        .ok()
        .and_then(|line| line.strip_prefix(HEADER))
        .and_then(|version| version.parse::<u64>().ok())
        .ok_or_else(bad)?;
    Ok(Some(Versioned::new(
        contents[newline + 1..].to_vec(),
        version,
    )))
}

fn read(file: &mut File) -> std::io::Result<Option<Versioned>> {
    let mut contents = Vec::new();
    file.read_to_end(&mut contents)?;
    parse(&contents)
}

fn get_blocking(root: &Path, rel: &Path) -> std::io::Result<Option<Versioned>> {
    match File::open(root.join(rel)) {
        Ok(mut file) => read(&mut file),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The file of the value at `path`, locked, and still the one at the path.
fn lock_current(path: &Path) -> std::io::Result<Flock<File>> {
    loop {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(path)?;
        // Writes hold it only to read, write and rename: a wait of a moment.
        let locked = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| std::io::Error::from(errno))?;
        // A writer that held it before renamed a new file over it: lock that one.
        if is_at(&locked, path)? {
            return Ok(locked);
        }
    }
}

/// Writes the value at `rel` if `expect` holds and `still_held` (a fenced write's check of
/// its hold, made under the value file's lock) says yes.
fn put_blocking(
    root: &Path,
    rel: &Path,
    expect: Expect,
    value: &[u8],
    still_held: impl FnOnce() -> std::io::Result<bool>,
) -> std::io::Result<Option<u64>> {
    paths::create_parents_durably(root, rel)?;
    let temp_dir = paths::temp_dir();
    paths::create_parents_durably(root, &temp_dir.join("x"))?;
    let path = root.join(rel);
    let mut current = lock_current(&path)?;
    let version = read(&mut current)?.map(|held| held.version);
    if !expect.holds(version) || !still_held()? {
        return Ok(None);
    }
    let next = version.unwrap_or(0) + 1;
    let temp = root
        .join(&temp_dir)
        .join(uuid::Uuid::new_v4().simple().to_string());
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(nix::libc::O_CLOEXEC)
            .open(&temp)?;
        file.write_all(format!("{HEADER}{next}\n").as_bytes())?;
        file.write_all(value)?;
        file.sync_all()?;
        std::fs::rename(&temp, &path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    drop(current);
    Ok(Some(next))
}

#[async_trait]
impl ValueStore for FileBackend {
    async fn get(&self, name: &LockName) -> Result<Option<Versioned>> {
        let rel = value_file(name)?;
        let root = self.inner.config.dir.clone();
        let shown = root.join(&rel);
        tokio::task::spawn_blocking(move || get_blocking(&root, &rel))
            .await
            .map_err(thread_gone)?
            .map_err(|e| from_io(&shown, e))
    }

    async fn put(&self, name: &LockName, expect: Expect, value: &[u8]) -> Result<Option<u64>> {
        let rel = value_file(name)?;
        let root = self.inner.config.dir.clone();
        let shown = root.join(&rel);
        let value = value.to_vec();
        tokio::task::spawn_blocking(move || put_blocking(&root, &rel, expect, &value, || Ok(true)))
            .await
            .map_err(thread_gone)?
            .map_err(|e| from_io(&shown, e))
    }
}

/// A fenced write in the folder `root`: the value written under its file's lock only while
/// `still_held` says the hold is still its lock's (see `Held::put_fenced`).
pub(super) async fn put_checked(
    root: &Path,
    name: &LockName,
    value: &[u8],
    still_held: impl FnOnce() -> std::io::Result<bool> + Send + 'static,
) -> Result<Option<u64>> {
    let rel = value_file(name)?;
    let root = root.to_path_buf();
    let shown = root.join(&rel);
    let value = value.to_vec();
    tokio::task::spawn_blocking(move || put_blocking(&root, &rel, Expect::Any, &value, still_held))
        .await
        .map_err(thread_gone)?
        .map_err(|e| from_io(&shown, e))
}
