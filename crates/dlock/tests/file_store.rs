#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! What is specific to the file backend: its locks are the `flock` that `flock(1)` and
//! Python's `filelock` take on the same path, both ways; the file's removal under a holder; the
//! mapping of names to paths. Lock behaviour itself is specified by the conformance suite.
#![cfg(feature = "file")]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dlock::{Error, LostReason};

/// Debian's Python, which has `python3-filelock` (scripts/test.sh installs it).
const PYTHON: &str = "/usr/bin/python3";

/// Holds Python's `filelock.FileLock` on the path given, until its stdin closes.
const PYTHON_HOLDER: &str = "import filelock, sys
lock = filelock.FileLock(sys.argv[1])
lock.acquire(timeout=0)
print('locked', flush=True)
sys.stdin.read()
lock.release()";

/// Exits 0 if Python's `filelock` gets the lock at once, 3 if it is held.
const PYTHON_TRY: &str = "import filelock, sys
try:
    filelock.FileLock(sys.argv[1]).acquire(timeout=0)
except filelock.Timeout:
    sys.exit(3)";

fn url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// Another program holding the lock file: it printed `locked`, and lets go when its stdin
/// closes (or when killed).
struct Foreign {
    child: Child,
}

impl Foreign {
    fn start(mut command: Command) -> Foreign {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the foreign holder");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "locked", "the foreign holder did not lock");
        Foreign { child }
    }

    /// `flock(1)` holding `path` while its shell reads stdin.
    fn flock(path: &Path) -> Foreign {
        let mut command = Command::new("flock");
        command
            .arg("--nonblock")
            .arg(path)
            .args(["sh", "-c", "echo locked; cat >/dev/null"]);
        Foreign::start(command)
    }

    /// Python's `filelock` holding `path`.
    fn python(path: &Path) -> Foreign {
        let mut command = Command::new(PYTHON);
        command.args(["-c", PYTHON_HOLDER]).arg(path);
        Foreign::start(command)
    }

    /// Closes its stdin: it releases and exits.
    fn release(mut self) {
        drop(self.child.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the foreign holder failed: {status}");
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `flock -n PATH true` got the lock.
fn flock_gets(path: &Path) -> bool {
    let status = Command::new("flock")
        .arg("--nonblock")
        .arg(path)
        .arg("true")
        .status()
        .unwrap();
    match status.code() {
        Some(0) => true,
        Some(1) => false,
        other => panic!("flock(1) failed otherwise: {other:?}"),
    }
}

/// Whether Python's `filelock` got the lock at once.
fn python_gets(path: &Path) -> bool {
    let status = Command::new(PYTHON)
        .args(["-c", PYTHON_TRY])
        .arg(path)
        .status()
        .unwrap();
    match status.code() {
        Some(0) => true,
        Some(3) => false,
        other => {
            panic!("Python's filelock failed otherwise (is python3-filelock installed?): {other:?}")
        }
    }
}

fn lock_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dlock-file-")
        .tempdir()
        .unwrap()
}

async fn busy(locks: &dlock::Locks, name: &str) -> bool {
    locks.mutex(name).try_acquire().await.unwrap().is_none()
}

#[tokio::test]
async fn flock_1_and_dlock_exclude_each_other_both_ways() {
    let dir = lock_dir();
    let locks = dlock::connect(&url(dir.path())).await.unwrap();
    let path = dir.path().join("jobs/nightly");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();

    let foreign = Foreign::flock(&path);
    assert!(
        busy(&locks, "jobs/nightly").await,
        "dlock got a lock flock(1) holds"
    );
    let run = dlock_testkit::cli::dlock_command(&url(dir.path()))
        .unwrap()
        .args(["run", "--no-wait", "jobs/nightly", "--", "true"])
        .status()
        .unwrap();
    assert_eq!(
        run.code(),
        Some(75),
        "dlock run --no-wait while flock(1) holds"
    );
    foreign.release();

    let guard = locks.mutex("jobs/nightly").acquire().await.unwrap();
    assert!(!flock_gets(&path), "flock(1) got a lock dlock holds");
    guard.release().await.unwrap();
    assert!(flock_gets(&path), "flock(1) was refused a free lock");
    // The lock file stays: removing it would let a waiter with it open lock a lost file.
    assert!(path.is_file());
    let run = dlock_testkit::cli::dlock_command(&url(dir.path()))
        .unwrap()
        .args(["run", "--no-wait", "jobs/nightly", "--", "true"])
        .status()
        .unwrap();
    assert_eq!(run.code(), Some(0), "dlock run --no-wait on a free lock");
}

#[tokio::test]
async fn python_filelock_and_dlock_exclude_each_other_both_ways() {
    let dir = lock_dir();
    let locks = dlock::connect(&url(dir.path())).await.unwrap();
    let path = dir.path().join("report");
    let first = locks.mutex("report").acquire().await.unwrap();
    let fence = first.fence().get();
    assert!(!python_gets(&path), "filelock got a lock dlock holds");
    first.release().await.unwrap();

    // filelock opens its file with O_TRUNC: the fence is kept beside it, not in it.
    let foreign = Foreign::python(&path);
    assert!(
        busy(&locks, "report").await,
        "dlock got a lock filelock holds"
    );
    foreign.release();
    assert!(python_gets(&path), "filelock was refused a free lock");
    let next = locks.mutex("report").acquire().await.unwrap();
    assert!(
        next.fence().get() > fence,
        "the fence went back after filelock's hold"
    );
    next.release().await.unwrap();
}

/// The waiter is woken by the kernel's close event of the foreign holder, not found at the
/// engine's idle slice (one second).
#[tokio::test]
async fn a_release_by_flock_1_wakes_a_dlock_waiter_without_polling() {
    let dir = lock_dir();
    let locks = dlock::connect(&url(dir.path())).await.unwrap();
    let path = dir.path().join("handoff");
    let mut hand_offs = Vec::new();
    for _ in 0..3 {
        let foreign = Foreign::flock(&path);
        let waiter = tokio::spawn({
            let locks = locks.clone();
            async move {
                locks
                    .mutex("handoff")
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = std::time::Instant::now();
        tokio::task::spawn_blocking(move || foreign.release())
            .await
            .unwrap();
        let guard = waiter.await.unwrap().unwrap();
        hand_offs.push(released.elapsed());
        guard.release().await.unwrap();
    }
    hand_offs.sort();
    assert!(
        hand_offs[1] < Duration::from_millis(500),
        "hand-offs {hand_offs:?}: found at the idle slice, not woken"
    );
}

#[tokio::test]
async fn a_lock_file_removed_under_its_holder_is_lost_as_broken() {
    let dir = lock_dir();
    let locks = dlock::connect(&format!("{}?check_interval=50ms", url(dir.path())))
        .await
        .unwrap();
    let guard = locks.mutex("swept").acquire().await.unwrap();
    std::fs::remove_file(dir.path().join("swept")).unwrap();
    // Anyone may now lock a new file at the path.
    assert!(flock_gets(&dir.path().join("swept")));
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the holder of a removed lock file was not told");
    assert_eq!(guard.lost_reason(), Some(LostReason::Broken));
    let released = guard.release().await;
    assert!(
        matches!(released, Err(Error::NotOwned { .. })),
        "{released:?}"
    );
    let again = locks.mutex("swept").try_acquire().await.unwrap();
    assert!(again.is_some(), "the new file's lock was not free");
}

#[tokio::test]
async fn a_killed_holder_frees_the_lock_at_once_and_fences_keep_rising() {
    let dir = lock_dir();
    let url = url(dir.path());
    let locks = dlock::connect(&url).await.unwrap();
    let mut holder = tokio::task::spawn_blocking({
        let url = url.clone();
        move || dlock_testkit::cli::Holder::start(&url, "crash", &["--ttl", "10m"])
    })
    .await
    .unwrap()
    .unwrap();
    assert!(busy(&locks, "crash").await);
    holder.kill().unwrap();
    // No lease to wait out: the kernel dropped the dead process's flock.
    let next = locks.mutex("crash").try_acquire().await.unwrap();
    let next = next.expect("the killed holder's lock was still held");
    assert!(next.fence().get() > holder.fence);
    next.release().await.unwrap();
}

#[tokio::test]
async fn names_that_would_leave_the_folder_are_refused() {
    let outer = lock_dir();
    let dir = outer.path().join("locks");
    std::fs::create_dir(&dir).unwrap();
    let locks = dlock::connect(&url(&dir)).await.unwrap();
    for bad in [
        "../escape",
        "/abs",
        "a//b",
        "a/./b",
        "trailing/",
        ".dlock/fence/x",
    ] {
        let result = locks.mutex(bad).try_acquire().await;
        assert!(
            matches!(result, Err(Error::InvalidName { .. })),
            "{bad}: {result:?}"
        );
    }
    assert!(!outer.path().join("escape").exists());
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "a refused name left a file"
    );
}

#[tokio::test]
async fn a_name_that_is_the_folder_of_other_locks_is_the_wrong_type() {
    let dir = lock_dir();
    let locks = dlock::connect(&url(dir.path())).await.unwrap();
    let inner = locks.mutex("a/b").acquire().await.unwrap();
    let result = locks.mutex("a").try_acquire().await;
    assert!(matches!(result, Err(Error::WrongType { .. })), "{result:?}");
    inner.release().await.unwrap();
}

#[tokio::test]
async fn the_folder_must_be_absolute_local_and_exist() {
    let dir = lock_dir();
    for bad in [
        "file://relative/dir",
        "file://elsewhere.example/tmp",
        "file://",
    ] {
        let result = dlock::connect(bad).await;
        assert!(
            matches!(result, Err(Error::InvalidUrl { .. })),
            "{bad}: {result:?}"
        );
    }
    let missing: PathBuf = dir.path().join("not/yet");
    let result = dlock::connect(&url(&missing)).await;
    assert!(
        matches!(result, Err(Error::InvalidArgument { ref reason, .. }) if reason.contains("create_dirs")),
        "{result:?}"
    );
    let locks = dlock::connect(&format!("{}?create_dirs=true", url(&missing)))
        .await
        .unwrap();
    locks
        .mutex("x")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert!(missing.join("x").is_file());
}

/// Values live under the backend's own folder, never at a lock's path.
#[tokio::test]
async fn values_are_kept_apart_from_the_lock_files() {
    let dir = lock_dir();
    let locks = dlock::connect(&url(dir.path())).await.unwrap();
    let value = locks.value("config");
    let version = value.set(b"v1").await.unwrap();
    assert!(!dir.path().join("config").exists());
    let read = value.get().await.unwrap().unwrap();
    assert_eq!(
        (read.value.as_slice(), read.version),
        (b"v1".as_slice(), version)
    );
    let mut file = std::fs::File::create(dir.path().join(".dlock/values/config")).unwrap();
    file.write_all(b"not a value").unwrap();
    let result = value.get().await;
    assert!(matches!(result, Err(Error::WrongType { .. })), "{result:?}");
}

/// A fenced write checks, under the value file's lock, that the hold is still the lock of the
/// file at its path: once the file was removed (anyone may lock a new one there), the write
/// is refused and nothing written, before the hold's own periodic check has noticed.
#[tokio::test]
async fn a_fenced_write_after_the_lock_file_was_removed_is_refused() {
    let dir = lock_dir();
    let locks = dlock::connect(&format!("{}?check_interval=10m", url(dir.path())))
        .await
        .unwrap();
    let guard = locks
        .mutex("fenced")
        .ttl(Duration::from_secs(600))
        .acquire()
        .await
        .unwrap();
    let state = locks.value("fenced/state");
    let version = state.set_fenced(&guard, b"mine").await.unwrap();
    std::fs::remove_file(dir.path().join("fenced")).unwrap();
    let refused = state.set_fenced(&guard, b"late").await;
    assert!(matches!(refused, Err(Error::Lost { .. })), "{refused:?}");
    let now = state.get().await.unwrap().unwrap();
    assert_eq!((now.version, now.value.as_slice()), (version, &b"mine"[..]));
}
