//! Where each lock, fence and value lives under the folder, and the folders made durably.
//!
//! A lock named `N` is the file `DIR/N`: a `/` in the name is a folder, so `orders/42` is
//! `DIR/orders/42`, the file a shell script locks with `flock DIR/orders/42`. Names that
//! cannot be such a path are refused: an empty, `.` or `..` component (`a//b`, `/abs`,
//! `../x`: nothing may name a file outside the folder) and a first component `.dlock`, the
//! backend's own folder. A component longer than a file name may be (255 bytes) cannot exist
//! on disk, so no other program can lock it: such a name is kept under `.dlock/long/`,
//! escaped and cut into pieces, where only dlock looks.
//!
//! Beside the lock files, only dlock reads `DIR/.dlock/`: `fence/<path>` holds each lock's
//! fence counter, `values/<path>` each versioned value, `tmp/` the values being written.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The backend's own folder under `DIR`.
pub(super) const OWN: &str = ".dlock";

/// The longest file name (one path component) Linux filesystems take.
const NAME_MAX: usize = 255;

/// The bytes of each piece a long name is cut into (after its `_` prefix, which keeps a
/// piece from reading as `.` or `..`).
const PIECE: usize = 200;

/// The path of lock `name` relative to the folder, or why it cannot have one.
pub(super) fn lock_path(name: &str) -> Result<PathBuf, &'static str> {
    let components: Vec<&str> = name.split('/').collect();
    if components
        .iter()
        .any(|c| c.is_empty() || *c == "." || *c == "..")
    {
        return Err(
            "the file backend maps '/' to folders: a name may not have an empty, '.' or '..' \
             component",
        );
    }
    if components.first() == Some(&OWN) {
        return Err("'.dlock' is the file backend's own folder");
    }
    if components.iter().all(|c| c.len() <= NAME_MAX) {
        return Ok(components.iter().collect());
    }
    // Escaped so the pieces hold no '/', and prefixed by their count so that no name's file is
    // another's folder.
    let escaped = name.replace('%', "%25").replace('/', "%2F");
    let pieces: Vec<&[u8]> = escaped.as_bytes().chunks(PIECE).collect();
    let mut path = PathBuf::from(OWN)
        .join("long")
        .join(pieces.len().to_string());
    for piece in pieces {
        let mut component = b"_".to_vec();
        component.extend_from_slice(piece);
        path.push(OsStr::from_bytes(&component));
    }
    Ok(path)
}

/// The fence counter's file of the lock at `lock` (relative to the folder).
pub(super) fn fence_path(lock: &Path) -> PathBuf {
    Path::new(OWN).join("fence").join(lock)
}

/// The file of the value whose name maps to `path` (as [`lock_path`] maps it).
pub(super) fn value_path(path: &Path) -> PathBuf {
    Path::new(OWN).join("values").join(path)
}

/// Where values are written before they replace the old file.
pub(super) fn temp_dir() -> PathBuf {
    Path::new(OWN).join("tmp")
}

/// Creates the folders of `rel` under `root` that are missing, each flushed into its parent
/// so a crash cannot lose a counter's file with the folder it was made in.
pub(super) fn create_parents_durably(root: &Path, rel: &Path) -> std::io::Result<()> {
    let mut dir = root.to_path_buf();
    let Some(parent) = rel.parent() else {
        return Ok(());
    };
    for component in parent.components() {
        let child = dir.join(component);
        match std::fs::create_dir(&child) {
            Ok(()) => File::open(&dir)?.sync_all()?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        dir = child;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slashes_are_folders_and_what_could_escape_is_refused() {
        assert_eq!(lock_path("orders/42").unwrap(), PathBuf::from("orders/42"));
        assert_eq!(lock_path("a b#p0of3").unwrap(), PathBuf::from("a b#p0of3"));
        assert_eq!(lock_path(".hidden/x").unwrap(), PathBuf::from(".hidden/x"));
        for bad in [
            "/etc/passwd",
            "a//b",
            "a/",
            "..",
            "../x",
            "a/../b",
            "./a",
            ".dlock/x",
        ] {
            assert!(lock_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn long_components_go_under_the_own_folder_one_to_one() {
        let long = format!("p/{}", "x".repeat(300));
        let path = lock_path(&long).unwrap();
        assert!(path.starts_with(".dlock/long/2"), "{path:?}");
        assert!(path.components().all(|c| c.as_os_str().len() <= NAME_MAX));
        // A name whose escape is a prefix of another's has a different piece count.
        let longer = format!("p/{}", "x".repeat(500));
        let other = lock_path(&longer).unwrap();
        assert!(!other.starts_with(&path) && !path.starts_with(&other));
        assert_ne!(
            lock_path(&format!("p%2F{}", "x".repeat(300))).unwrap(),
            path
        );
    }
}
