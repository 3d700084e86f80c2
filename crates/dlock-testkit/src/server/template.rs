//! Data-dir templates: `initdb` and `mariadb-install-db` take seconds, so each runs once per
//! machine, binary and user into a cached template that every server then copies (SERVERS.md
//! pitfall 18: 0.4 s instead of 1.5–3 s).

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The cached template of `kind` for `bin`, built by `build(dir)` (which must fill
/// `dir/data`) the first time. The cache lives under the temp dir, keyed by the binary's
/// path, size and mtime and by the user, so an upgraded server gets a fresh template.
pub(crate) fn cached(
    kind: &str,
    bin: &Path,
    build: impl FnOnce(&Path) -> io::Result<()>,
) -> io::Result<PathBuf> {
    static MEMO: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let meta = fs::metadata(bin)?;
    let mut hasher = DefaultHasher::new();
    (
        bin,
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        current_uid(),
    )
        .hash(&mut hasher);
    let key = format!("{kind}-{:016x}", hasher.finish());
    let memo = MEMO.get_or_init(Mutex::default);
    // One builder at a time in this process; other processes race through the rename below.
    let mut memo = memo
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(dir) = memo.get(&key) {
        return Ok(dir.clone());
    }
    let root = std::env::temp_dir().join("dlock-test-templates");
    fs::create_dir_all(&root)?;
    let target = root.join(&key);
    if !target.join("data").is_dir() {
        let building = root.join(format!("{key}.building-{}", std::process::id()));
        let _ = fs::remove_dir_all(&building);
        fs::create_dir_all(&building)?;
        let built = build(&building);
        if let Err(e) = built {
            let _ = fs::remove_dir_all(&building);
            return Err(e);
        }
        // Atomic publish; if another process won the race, use its template.
        if fs::rename(&building, &target).is_err() {
            let _ = fs::remove_dir_all(&building);
            if !target.join("data").is_dir() {
                return Err(io::Error::other(format!(
                    "could not publish the {kind} template at {}",
                    target.display()
                )));
            }
        }
    }
    memo.insert(key, target.clone());
    Ok(target)
}

/// Copies `template/data` to `dir/data`, keeping owners and modes (`cp -a`).
pub(crate) fn copy_data(template: &Path, dir: &Path) -> io::Result<()> {
    run(Command::new("cp")
        .arg("-a")
        .arg(template.join("data"))
        .arg(dir.join("data")))
}

/// Runs a one-shot command; a failure carries its output.
pub(crate) fn run(cmd: &mut Command) -> io::Result<()> {
    let out = cmd.output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{cmd:?} failed with {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// The effective user id of this process.
#[allow(unsafe_code)]
pub(crate) fn current_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The uid and gid of a system user, read from `/etc/passwd`.
pub(crate) fn user_ids(user: &str) -> io::Result<(u32, u32)> {
    let passwd = fs::read_to_string("/etc/passwd")?;
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() > 3 && fields[0] == user)
                .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
                .flatten()
        })
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no system user {user:?} (needed to run the server as non-root)"),
            )
        })
}
