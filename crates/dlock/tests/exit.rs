#![cfg(feature = "sqlite")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! A guard still alive when a program ends is released before the process exits, in the
//! shapes programs end in: `#[tokio::main]` returning, a runtime dropped with a task holding a
//! guard, `std::process::exit` after `Locks::close`, and the `cron_job` example run to its end.
//!
//! Each shape runs as a real process: this test binary run again with `DLOCK_EXIT_CHILD` set
//! (the `child` test). The child takes the lock and says `held`; the parent checks the lock is
//! busy, tells the child to end its shape, and once the child says `ended` (still alive, so
//! SQLite's freeing of a dead process's locks cannot be what frees it) asks for the lock once:
//! it must be free at once, not after its 30 s lease.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};

use dlock_testkit::fixture::{Fixture, SqliteFixture};

// The example itself, run as the child program (its `main` is `pub` for this).
#[allow(unreachable_pub)]
#[path = "../examples/cron_job.rs"]
mod cron_job;

const CHILD: &str = "DLOCK_EXIT_CHILD";
const NAME: &str = "exit/held-at-the-end";
const MARK: &str = "dlock-exit: ";

fn say(what: &str) {
    println!("{MARK}{what}");
}

/// Waits for the parent's go-ahead (a line, or the end of stdin).
fn wait_for_parent() {
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

async fn take(url: &str) -> (dlock::Locks, dlock::MutexGuard) {
    let locks = dlock::connect(url).await.unwrap();
    let guard = locks.mutex(NAME).no_wait().acquire().await.unwrap();
    (locks, guard)
}

#[tokio::main]
async fn tokio_main_returning(url: String) {
    let (_locks, _guard) = take(&url).await;
    say("held");
    wait_for_parent();
}

fn runtime_dropped(url: String) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (locks, guard) = take(&url).await;
        // A task the runtime drops unfinished owns the guard (and the client).
        tokio::spawn(async move {
            let _held = (locks, guard);
            std::future::pending::<()>().await;
        });
        say("held");
        wait_for_parent();
    });
    drop(runtime);
}

fn close_then_exit(url: String) -> ! {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (locks, guard) = take(&url).await;
        say("held");
        wait_for_parent();
        assert_eq!(locks.close().await.unwrap(), 1);
        say("ended");
        wait_for_parent();
        // No destructor runs: only `close` let the lock go.
        std::mem::forget(guard);
        std::process::exit(0)
    })
}

#[test]
#[ignore = "the child process of the other tests in this file"]
fn child() {
    let shape = std::env::var(CHILD).unwrap();
    let url = std::env::var("DLOCK_URL").unwrap();
    match shape.as_str() {
        "tokio-main" => tokio_main_returning(url),
        "runtime-dropped" => runtime_dropped(url),
        "close-then-exit" => close_then_exit(url),
        "cron-job" => return cron_job::main().unwrap(),
        other => panic!("unknown shape {other}"),
    }
    say("ended");
    wait_for_parent();
}

struct Program {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Program {
    fn start(shape: &str, url: &str) -> Program {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, shape)
            .env("DLOCK_URL", url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Program { child, stdout }
    }

    /// Reads the child's output up to its next `said` line.
    fn expect(&mut self, said: &str) {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "the child ended before saying {said:?}");
            // libtest may print its "test child ... " on the same line first.
            if line.trim_end().ends_with(&format!("{MARK}{said}")) {
                return;
            }
        }
    }

    fn go_on(&mut self) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }

    fn finish(mut self) {
        drop(self.child.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the child failed: {status}");
    }
}

fn checker() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Whether `NAME` can be taken at once; gives it back if so.
fn free_at_once(runtime: &tokio::runtime::Runtime, locks: &dlock::Locks) -> bool {
    runtime.block_on(async {
        match locks.mutex(NAME).try_acquire().await.unwrap() {
            Some(guard) => {
                guard.release().await.unwrap();
                true
            }
            None => false,
        }
    })
}

fn check_shape(url: &str, shape: &str) {
    let runtime = checker();
    let locks = runtime.block_on(dlock::connect(url)).unwrap();
    let mut program = Program::start(shape, url);
    program.expect("held");
    assert!(
        !free_at_once(&runtime, &locks),
        "{shape}: the child does not hold the lock"
    );
    program.go_on();
    program.expect("ended");
    assert!(
        free_at_once(&runtime, &locks),
        "{shape}: the lock was still held after the program ended its runtime"
    );
    program.finish();
}

fn check_cron_job(url: &str) {
    let runtime = checker();
    let locks = runtime.block_on(dlock::connect(url)).unwrap();
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "cron-job")
        .env("DLOCK_URL", url)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("running the nightly report"), "{stdout}");
    runtime.block_on(async {
        let next = locks
            .mutex("jobs/nightly-report")
            .try_acquire()
            .await
            .unwrap();
        assert!(
            next.is_some(),
            "the next run found the job's lock still held"
        );
    });
}

fn sqlite() -> (std::sync::Arc<SqliteFixture>, String) {
    let fixture = SqliteFixture::new().unwrap();
    let url = fixture.url().unwrap();
    (fixture, url)
}

#[test]
fn sqlite_tokio_main_returning_releases() {
    let (_fixture, url) = sqlite();
    check_shape(&url, "tokio-main");
}

#[test]
fn sqlite_runtime_dropped_releases() {
    let (_fixture, url) = sqlite();
    check_shape(&url, "runtime-dropped");
}

#[test]
fn sqlite_close_before_process_exit_releases() {
    let (_fixture, url) = sqlite();
    check_shape(&url, "close-then-exit");
}

#[test]
fn sqlite_cron_job_leaves_its_lock_free() {
    let (_fixture, url) = sqlite();
    check_cron_job(&url);
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use dlock_testkit::fixture::RedisFixture;

    fn redis() -> Option<(std::sync::Arc<RedisFixture>, String)> {
        let fixture = RedisFixture::start().unwrap()?;
        let url = fixture.url().unwrap();
        Some((fixture, url))
    }

    #[test]
    fn redis_tokio_main_returning_releases() {
        let Some((_fixture, url)) = redis() else {
            return;
        };
        check_shape(&url, "tokio-main");
    }

    #[test]
    fn redis_runtime_dropped_releases() {
        let Some((_fixture, url)) = redis() else {
            return;
        };
        check_shape(&url, "runtime-dropped");
    }

    #[test]
    fn redis_close_before_process_exit_releases() {
        let Some((_fixture, url)) = redis() else {
            return;
        };
        check_shape(&url, "close-then-exit");
    }

    #[test]
    fn redis_cron_job_leaves_its_lock_free() {
        let Some((_fixture, url)) = redis() else {
            return;
        };
        check_cron_job(&url);
    }
}
