#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! `dlock elect` across processes under the store's faults, on a real Redis of the test kit
//! (`tests/elect.rs` has the killed leader, on SQLite): the store restarted without its data,
//! and the leader cut off from the store by the test kit's fault proxy while another elector
//! still reaches it. Without redis-server the tests are reported as ignored (failed with
//! `DLOCK_TEST_REQUIRE=redis`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::fault_proxy::{FaultProxy, NetFault};
use dlock_testkit::server::{Redis, ServerProcess, find_binary, required};
use libtest_mimic::{Arguments, Failed, Trial};

/// The electors' lease: short, so the faults play out in seconds.
const LEASE: &str = "1s";

struct Files(tempfile::TempDir);

impl Files {
    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    /// `dlock elect --ttl 1s NAME` on `url` publishing `who`, its command writing its term
    /// and its pids to files named after `who` and waiting on two background workers.
    fn elector(&self, url: &str, name: &str, who: &str) -> Child {
        let (term, pids) = (
            self.path(&format!("{who}.term")),
            self.path(&format!("{who}.pids")),
        );
        let script = format!(
            "echo $DLOCK_TERM > {t}.tmp; mv {t}.tmp {t}; sleep 300 & echo $! >> {p}; \
             sleep 300 & echo $! >> {p}; echo $$ >> {p}; wait",
            t = term.display(),
            p = pids.display()
        );
        dlock(url)
            .args([
                "elect", "--ttl", LEASE, "--value", who, name, "--", "sh", "-c", &script,
            ])
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }
}

fn dlock(url: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock"));
    cmd.args(["--url", url])
        .env_remove("DLOCK_URL")
        .env_remove("DLOCK_LABEL")
        .stdin(Stdio::null());
    cmd
}

/// `dlock leader --json NAME` on `url`: the leader's value and term, `None` when nobody leads.
fn leader(url: &str, name: &str) -> Option<(String, u64)> {
    let out = dlock(url)
        .args(["leader", "--json", name])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some((json["value"].as_str()?.to_owned(), json["term"].as_u64()?))
}

fn eventually(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what} (after {limit:?})");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The term an elector's command was given, once it has started.
fn term_of(path: &Path, limit: Duration) -> u64 {
    let mut term = None;
    eventually(limit, &format!("{} never led", path.display()), || {
        term = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok());
        term.is_some()
    });
    term.unwrap()
}

/// The command's pids: the shell and its two workers.
fn pids_of(path: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    eventually(Duration::from_secs(10), "the command's pids", || {
        pids = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        pids.len() == 3
    });
    pids
}

fn is_dead(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| stat.contains(") Z "))
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn redis() -> ServerProcess {
    ServerProcess::start(Redis::default()).unwrap_or_else(|e| panic!("{e}"))
}

/// Redis restarted without persistence comes back empty: the leader's term ends in the store.
/// The leader is told (its renewal is refused) and its command's whole process group stopped;
/// the waiting elector leads with a greater term (Redis's fences rise across data loss).
fn a_store_restart_ends_the_term_and_the_next_leader_has_a_greater_term() {
    let mut server = redis();
    let url = format!("redis://{}", server.addr());
    let files = Files(tempfile::tempdir().unwrap());
    let a = files.elector(&url, "jobs", "a");
    let term_a = term_of(&files.path("a.term"), Duration::from_secs(30));
    let a_pids = pids_of(&files.path("a.pids"));
    let b = files.elector(&url, "jobs", "b");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!files.path("b.term").exists(), "two leaders at once");

    server.restart().unwrap();
    let restarted = Instant::now();
    eventually(
        Duration::from_secs(30),
        "the deposed leader's command kept running after the restart",
        || a_pids.iter().all(|&pid| is_dead(pid)),
    );
    let stopped_after = restarted.elapsed();
    let term_b = term_of(&files.path("b.term"), Duration::from_secs(30));
    assert!(term_b > term_a, "term {term_b} after {term_a}");
    eventually(Duration::from_secs(10), "dlock leader shows node b", || {
        leader(&url, "jobs") == Some(("b".into(), term_b))
    });
    eprintln!(
        "store restart: the deposed leader's command stopped {} ms after the restart returned",
        stopped_after.as_millis()
    );
    stop(a);
    stop(b);
}

/// The leader cut off from Redis (its own fault proxy blackholed) while the other elector
/// still reaches it: the leader's lease runs out unrenewed, it stops its command, and only
/// then does the other elector lead, with a greater term.
fn a_partitioned_leader_stops_its_command_before_the_next_leader_starts() {
    let server = redis();
    let proxy = FaultProxy::start(&[server.addr()]).unwrap();
    let (cut_url, url) = (
        format!("redis://{}", proxy.addrs()[0]),
        format!("redis://{}", server.addr()),
    );
    let files = Files(tempfile::tempdir().unwrap());
    let a = files.elector(&cut_url, "jobs", "a");
    let term_a = term_of(&files.path("a.term"), Duration::from_secs(30));
    let a_pids = pids_of(&files.path("a.pids"));
    let b = files.elector(&url, "jobs", "b");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!files.path("b.term").exists(), "two leaders at once");

    proxy.set(NetFault::Blackhole);
    let cut = Instant::now();
    let term_b = term_of(&files.path("b.term"), Duration::from_secs(30));
    let took_over = cut.elapsed();
    let still_running: Vec<i32> = a_pids
        .iter()
        .copied()
        .filter(|&pid| !is_dead(pid))
        .collect();
    assert!(
        still_running.is_empty(),
        "the partitioned leader's command ({still_running:?}) still ran when the next leader started"
    );
    assert!(term_b > term_a, "term {term_b} after {term_a}");
    assert_eq!(leader(&url, "jobs"), Some(("b".into(), term_b)));
    eprintln!(
        "partition: the next leader started {} ms after the cut",
        took_over.as_millis()
    );
    stop(a);
    proxy.set(NetFault::None);
    stop(b);
}

fn main() {
    let args = Arguments::from_args();
    let installed = find_binary(&Redis::default()).is_some() || required("redis");
    let tests: [(&str, fn()); 2] = [
        (
            "redis_store_restart_ends_the_term_and_the_next_leader_has_a_greater_term",
            a_store_restart_ends_the_term_and_the_next_leader_has_a_greater_term,
        ),
        (
            "redis_partitioned_leader_stops_its_command_before_the_next_leader_starts",
            a_partitioned_leader_stops_its_command_before_the_next_leader_starts,
        ),
    ];
    let trials = tests
        .into_iter()
        .map(|(name, test)| {
            Trial::test(name, move || {
                std::panic::catch_unwind(test).map_err(|panic| {
                    let text = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "panicked".into());
                    Failed::from(text)
                })
            })
            .with_ignored_flag(!installed)
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
