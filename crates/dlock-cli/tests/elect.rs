#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! `dlock elect` and `dlock leader` end to end, across processes on one SQLite file: one
//! leader at a time, a killed leader replaced with a greater term, the command's whole
//! process group stopped when leadership is lost, and `dlock leader --json` / `--watch`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Env {
    dir: tempfile::TempDir,
    url: String,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("locks.db").display());
        Env { dir, url }
    }

    fn cmd(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock"));
        cmd.env("DLOCK_URL", &self.url)
            .env_remove("DLOCK_LABEL")
            .stdin(Stdio::null());
        cmd
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `dlock leader --json NAME`: the leader's object, or `None` when nobody leads.
    fn leader(&self, name: &str) -> Option<serde_json::Value> {
        let out = self
            .cmd()
            .args(["leader", "--json", name])
            .output()
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        match out.status.code() {
            Some(0) => Some(json),
            Some(1) => {
                assert!(json.is_null(), "{json}");
                None
            }
            other => panic!("dlock leader exited {other:?}"),
        }
    }

    /// `dlock elect` of `name` with `value`, its command writing its term and pids to files
    /// named after `who` and waiting on two background workers.
    fn elector(&self, name: &str, value: &str, who: &str, extra: &[&str]) -> Child {
        let term = self.path(&format!("{who}.term"));
        let pids = self.path(&format!("{who}.pids"));
        let script = format!(
            "echo $DLOCK_TERM > {t}.tmp; mv {t}.tmp {t}; sleep 300 & echo $! >> {p}; \
             sleep 300 & echo $! >> {p}; echo $$ >> {p}; wait",
            t = term.display(),
            p = pids.display()
        );
        self.cmd()
            .args(["elect", "--value", value])
            .args(extra)
            .args([name, "--", "sh", "-c", &script])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

fn eventually(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what} (after {limit:?})");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_with_timeout(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("process did not exit within {limit:?}");
        }
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

fn pids_of(path: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    eventually(
        Duration::from_secs(10),
        "the command never started its workers",
        || {
            pids = std::fs::read_to_string(path)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            pids.len() >= 3
        },
    );
    pids
}

fn is_dead(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| stat.contains(") Z "))
}

#[test]
fn a_killed_leader_is_replaced_by_the_other_elector_with_a_greater_term() {
    let env = Env::new();
    assert!(env.leader("jobs").is_none(), "a leader before any elector");
    let mut a = env.elector("jobs", "node-a", "a", &["--ttl", "1s"]);
    let term_a = term_of(&env.path("a.term"), Duration::from_secs(10));
    let mut b = env.elector("jobs", "node-b", "b", &["--ttl", "1s"]);
    let a_pids = pids_of(&env.path("a.pids"));
    let now = env.leader("jobs").expect("a leader");
    assert_eq!(now["value"], "node-a");
    assert_eq!(now["term"], term_a);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!env.path("b.term").exists(), "two leaders at once");

    a.kill().unwrap();
    a.wait().unwrap();
    let term_b = term_of(&env.path("b.term"), Duration::from_secs(15));
    assert!(term_b > term_a, "term {term_b} after {term_a}");
    eventually(
        Duration::from_secs(10),
        "a killed leader's command kept running",
        || a_pids.iter().all(|&pid| is_dead(pid)),
    );
    let now = env.leader("jobs").expect("a leader");
    assert_eq!(now["value"], "node-b");
    assert_eq!(now["term"], term_b);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(b.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_with_timeout(&mut b, Duration::from_secs(10));
    eventually(
        Duration::from_secs(10),
        "the resigned leader is still shown",
        || env.leader("jobs").is_none(),
    );
}

#[test]
fn lost_leadership_stops_the_commands_whole_process_group() {
    let env = Env::new();
    let mut elector = env.elector("fragile", "v", "e", &["--ttl", "300ms"]);
    term_of(&env.path("e.term"), Duration::from_secs(10));
    let pids = pids_of(&env.path("e.pids"));
    let out = env
        .cmd()
        .args(["break", "--yes", "fragile"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = wait_with_timeout(&mut elector, Duration::from_secs(10));
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "the command should die of SIGTERM"
    );
    eventually(
        Duration::from_secs(10),
        "a worker outlived lost leadership",
        || pids.iter().all(|&pid| is_dead(pid)),
    );
    let mut err = String::new();
    std::io::Read::read_to_string(&mut elector.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("was lost while the command ran"), "{err}");
}

#[test]
fn leader_json_has_value_term_owner_and_ttl_left_and_watch_follows_changes() {
    let env = Env::new();
    let mut watch = env
        .cmd()
        .args(["leader", "--watch", "--json", "w"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            let _ = lines_tx.send(line);
        }
    });
    let next = || -> serde_json::Value {
        let line = lines
            .recv_timeout(Duration::from_secs(15))
            .expect("no change seen");
        serde_json::from_str(&line).unwrap()
    };
    assert!(
        next().is_null(),
        "the first item is the current leader: none"
    );
    let mut elector = env
        .cmd()
        .args([
            "--label",
            "svc",
            "elect",
            "--value",
            "10.0.0.7:80",
            "w",
            "--",
            "sleep",
            "300",
        ])
        .spawn()
        .unwrap();
    let seen = next();
    let now = env.leader("w").expect("a leader");
    for json in [&seen, &now] {
        assert_eq!(json["value"], "10.0.0.7:80");
        assert!(json["term"].as_u64().unwrap() > 0);
        assert!(json["owner"].as_str().unwrap().contains("svc"), "{json}");
        let ttl_left = json["ttl_left"].as_f64().unwrap();
        assert!(ttl_left > 0.0 && ttl_left <= 30.0, "{json}");
    }
    assert_eq!(seen["term"], now["term"]);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(elector.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_with_timeout(&mut elector, Duration::from_secs(10));
    assert!(
        next().is_null(),
        "the leader that resigned is still observed"
    );
    watch.kill().unwrap();
    watch.wait().unwrap();
}
