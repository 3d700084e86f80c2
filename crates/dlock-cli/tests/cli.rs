#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! The `dlock` command end to end, as users run it: exit codes, environment, signals, lost
//! locks, and bad input (a clear message and a non-zero exit, never a panic, no lock left).

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
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

    fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A `dlock run NAME -- sleep 30` that holds `name` until killed, started and waited for.
    fn hold_in_background(&self, name: &str) -> Child {
        let holder = self
            .cmd()
            .args(["run", name, "--", "sleep", "30"])
            .spawn()
            .unwrap();
        wait_until_held(self, name);
        holder
    }

    /// Every lock held in the store, as `dlock ls --json` reports it.
    fn held(&self) -> Vec<serde_json::Value> {
        let out = self.run(&["ls", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).unwrap()
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
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

/// Polls `done` until it holds, failing the test after `limit`.
fn eventually(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what} (after {limit:?})");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_until_held(env: &Env, name: &str) {
    eventually(
        Duration::from_secs(10),
        &format!("{name} never became held"),
        || env.held().iter().any(|l| l["name"] == name),
    );
}

#[test]
fn run_passes_fence_and_name_and_returns_the_command_exit_code() {
    let env = Env::new();
    let out = env.run(&[
        "run",
        "jobs/report",
        "--",
        "sh",
        "-c",
        "echo $DLOCK_NAME $DLOCK_FENCE; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "jobs/report 1\n");
    let out = env.run(&["run", "jobs/report", "--", "sh", "-c", "echo $DLOCK_FENCE"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "2\n");
    assert!(env.held().is_empty(), "run left its lock held");
}

#[test]
fn run_reports_busy_timed_out_and_missing_commands_with_distinct_codes() {
    let env = Env::new();
    let mut holder = env.hold_in_background("busy");
    let out = env.run(&["run", "--no-wait", "busy", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(stderr(&out).contains("busy is held by"), "{}", stderr(&out));
    let out = env.run(&["run", "--wait", "200ms", "busy", "--", "true"]);
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    holder.kill().unwrap();
    holder.wait().unwrap();

    let out = env.run(&["run", "free", "--", "/no/such/program"]);
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
    let script = env.path("not-executable.sh");
    std::fs::write(&script, "echo hi").unwrap();
    let out = env.run(&["run", "free", "--", script.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(126), "{}", stderr(&out));
    assert!(
        !env.held().iter().any(|l| l["name"] == "free"),
        "a failed run left its lock held"
    );
}

#[test]
fn a_lost_lock_terminates_the_command_and_says_so() {
    let env = Env::new();
    let mut run = env
        .cmd()
        .args(["run", "--ttl", "300ms", "fragile", "--", "sleep", "30"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until_held(&env, "fragile");
    let out = env.run(&["break", "--yes", "fragile"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let status = wait_with_timeout(&mut run, Duration::from_secs(10));
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "sleep should have died of SIGTERM"
    );
    let mut err = String::new();
    run.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(
        err.contains("was lost while the command ran; sending SIGTERM"),
        "{err}"
    );
}

#[test]
fn a_command_that_ignores_sigterm_after_a_loss_is_killed() {
    let env = Env::new();
    let mut run = env
        .cmd()
        .args([
            "run",
            "--ttl",
            "300ms",
            "--kill-after",
            "300ms",
            "stubborn",
            "--",
        ])
        .args(["sh", "-c", "trap '' TERM; exec sleep 30"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until_held(&env, "stubborn");
    assert!(env.run(&["break", "--yes", "stubborn"]).status.success());
    let status = wait_with_timeout(&mut run, Duration::from_secs(10));
    assert_eq!(
        status.code(),
        Some(128 + 9),
        "the command should have been killed"
    );
    let mut err = String::new();
    run.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("sending SIGKILL"), "{err}");
}

#[test]
fn a_lost_lock_with_a_successful_command_exits_76() {
    let env = Env::new();
    let mut run = env
        .cmd()
        .args([
            "run",
            "--ttl",
            "300ms",
            "--on-lost",
            "ignore",
            "fragile",
            "--",
            "sleep",
            "1",
        ])
        .spawn()
        .unwrap();
    wait_until_held(&env, "fragile");
    assert!(env.run(&["break", "--yes", "fragile"]).status.success());
    let status = wait_with_timeout(&mut run, Duration::from_secs(10));
    assert_eq!(status.code(), Some(76));
}

#[test]
fn sigterm_is_forwarded_to_the_command() {
    let env = Env::new();
    let mut run = env
        .cmd()
        .args([
            "run",
            "polite",
            "--",
            "sh",
            "-c",
            "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = run.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    stdout.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ready\n");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_with_timeout(&mut run, Duration::from_secs(10));
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert_eq!(status.code(), Some(7), "output: {rest}");
    assert!(rest.contains("got-term"));
    assert!(env.held().is_empty(), "the lock outlived the command");
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).unwrap();
}

#[test]
fn a_signal_while_waiting_ends_the_wait_without_running_the_command() {
    let env = Env::new();
    let mut holder = env.hold_in_background("busy");
    let marker = env.path("ran");
    let mut waiter = env
        .cmd()
        .args(["run", "busy", "--", "touch", marker.to_str().unwrap()])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    signal(waiter.id(), nix::sys::signal::Signal::SIGTERM);
    let status = wait_with_timeout(&mut waiter, Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + 15));
    assert!(!marker.exists(), "the command ran without the lock");
    holder.kill().unwrap();
    holder.wait().unwrap();
}

#[test]
fn a_killed_dlock_takes_its_command_down() {
    let env = Env::new();
    let mut run = env
        .cmd()
        .args(["run", "orphan", "--", "sh", "-c", "echo $$; exec sleep 30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(run.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let child: u32 = line.trim().parse().unwrap();
    run.kill().unwrap();
    run.wait().unwrap();
    // Without the lock the command must not run on: it gets SIGTERM when dlock dies.
    eventually(
        Duration::from_secs(10),
        "the command outlived dlock",
        || {
            // Gone, or a zombie nobody has reaped yet.
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .map_or(true, |stat| stat.contains(") Z "))
        },
    );
}

#[test]
fn ls_inspect_and_break_show_and_free_a_held_lock() {
    let env = Env::new();
    let mut holder = env
        .cmd()
        .args([
            "--label",
            "nightly-report",
            "hold",
            "--ttl",
            "600ms",
            "reports/nightly",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = [0u8; 11];
    holder.stdout.take().unwrap().read_exact(&mut line).unwrap();
    assert_eq!(&line, b"acquired 1\n");

    let held = env.held();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0]["name"], "reports/nightly");
    assert_eq!(held[0]["label"], "nightly-report");
    assert_eq!(held[0]["pid"], holder.id());
    assert_eq!(held[0]["fence"], 1);

    let table = env.run(&["ls", "reports/"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.starts_with("NAME")
            && table.contains("reports/nightly")
            && table.contains("nightly-report"),
        "{table}"
    );
    assert!(String::from_utf8_lossy(&env.run(&["ls", "other/"]).stdout).is_empty());

    let out = env.run(&["inspect", "reports/nightly", "--json"]);
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["holds"], 1);
    assert_eq!(
        env.run(&["inspect", "reports/other"]).status.code(),
        Some(1)
    );

    let out = env.run(&["break", "reports/nightly"]);
    assert_eq!(
        out.status.code(),
        Some(125),
        "break without --yes and without a terminal must refuse"
    );
    assert!(stderr(&out).contains("--yes"));
    assert_eq!(env.held().len(), 1);
    assert!(
        env.run(&["break", "--yes", "reports/nightly"])
            .status
            .success()
    );
    assert!(env.held().is_empty());
    assert_eq!(
        env.run(&["break", "--yes", "reports/nightly"])
            .status
            .code(),
        Some(1)
    );
    // The holder learns of the loss within its lease.
    let status = wait_with_timeout(&mut holder, Duration::from_secs(40));
    assert_eq!(status.code(), Some(76));
}

#[test]
fn processes_opening_a_new_database_at_once_all_succeed() {
    for _ in 0..5 {
        let env = Env::new();
        let children: Vec<Child> = (0..6)
            .map(|i| {
                env.cmd()
                    .args(["run", &format!("first-open-{i}"), "--", "true"])
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{}", stderr(&out));
        }
    }
}

/// On a terminal, a waiting `dlock run` says who holds the lock; `script` provides the terminal.
#[test]
fn waiting_on_a_terminal_shows_the_holder() {
    let env = Env::new();
    let mut holder = env
        .cmd()
        .args(["--label", "backup-job", "run", "busy", "--", "sleep", "30"])
        .spawn()
        .unwrap();
    wait_until_held(&env, "busy");
    let inner = format!(
        "DLOCK_URL='{}' '{}' run --wait 1500ms busy -- true",
        env.url,
        env!("CARGO_BIN_EXE_dlock")
    );
    let out = Command::new("script")
        .args(["-q", "-e", "-c", &inner, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("script (util-linux) runs the command on a pseudo-terminal");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("waiting for busy: held by backup-job@"),
        "{shown}"
    );
    assert!(shown.contains("timed out after 1s 500ms"), "{shown}");
    holder.kill().unwrap();
    holder.wait().unwrap();

    // Not on a terminal: nothing but the outcome.
    let mut holder = env.hold_in_background("busy");
    let out = env.run(&["run", "--wait", "700ms", "busy", "--", "true"]);
    assert!(!stderr(&out).contains("held by"), "{}", stderr(&out));
    holder.kill().unwrap();
    holder.wait().unwrap();
}

#[test]
fn the_default_url_is_a_sqlite_file_in_the_state_directory() {
    let home = tempfile::tempdir().unwrap();
    let state = home.path().join("state");
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .env_remove("DLOCK_URL")
        .env("HOME", home.path())
        .env("XDG_STATE_HOME", &state)
        .args(["run", "default", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(state.join("dlock/locks.db").is_file());
    let help = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .env("XDG_STATE_HOME", &state)
        .arg("--help")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("dlock/locks.db"));
}

/// A short smoke run: the benchmark runs every scenario and reports them (numbers are not
/// checked here; BENCHMARKS.md holds the real runs).
#[test]
fn bench_runs_every_scenario_and_reports_json() {
    let env = Env::new();
    let report = env.path("bench.json");
    let out = env.run(&[
        "bench",
        "--repeat",
        "1",
        "--pairs",
        "50",
        "--processes",
        "2",
        "--duration",
        "300ms",
        "--json",
        report.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("pairs/s") && text.contains("hand-offs/s"),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(json["backend"], "sqlite");
    for scenario in ["floor", "uncontended", "handoff"] {
        assert!(
            json[scenario]["acquisitions_per_sec"].is_object()
                || json[scenario]["pairs_per_sec"].is_object(),
            "{scenario}: {json}"
        );
    }
    assert!(
        json["handoff"]["fairness"]["median"]
            .as_f64()
            .is_some_and(|f| f > 0.0 && f <= 1.0)
    );
    let out = env.run(&[
        "bench",
        "--scenario",
        "watchdog",
        "--repeat",
        "1",
        "--held",
        "50",
        "--lease",
        "300ms",
        "--duration",
        "300ms",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("renewals/s"));
    let results = env.path("results");
    let many = results.join("many.json");
    let out = env.run(&[
        "bench",
        "--scenario",
        "many,handoff",
        "--tasks",
        "1,4",
        "--pairs",
        "40",
        "--repeat",
        "1",
        "--processes",
        "2",
        "--duration",
        "300ms",
        "--json",
        many.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&many).unwrap()).unwrap();
    let points = json["many"]["points"].as_array().unwrap();
    assert_eq!(points.len(), 2, "{json}");
    assert_eq!(points[1]["tasks"], 4);
    // The gap distribution behind the chart.
    assert!(
        json["handoff"]["gap_quantiles_us"]
            .as_array()
            .is_some_and(|q| q.len() > 10),
        "{json}"
    );
    assert!(env.held().is_empty(), "the bench left locks behind");
    // The report: Markdown tables and SVG charts from the JSON of the runs above.
    std::fs::copy(&report, results.join("sqlite.json")).unwrap();
    let markdown = env.path("BENCHMARKS.md");
    let out = env.run(&[
        "bench",
        "--report",
        results.to_str().unwrap(),
        "--out",
        markdown.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&markdown).unwrap();
    assert!(
        text.contains("## Contended hand-off") && text.contains("## Many distinct locks"),
        "{text}"
    );
    for chart in ["handoff-gap.svg", "throughput-vs-tasks.svg"] {
        let svg = std::fs::read_to_string(env.path("charts").join(chart)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("polyline"),
            "{chart}: {svg}"
        );
        assert!(text.contains(&format!("charts/{chart}")), "{text}");
    }
}

/// Each bad input: a non-zero exit, a message naming the problem, no panic, no lock left.
#[test]
fn bad_input_gets_a_clear_error_and_leaves_no_lock() {
    let env = Env::new();
    let text_file = env.path("notes.txt");
    std::fs::write(&text_file, "not a database").unwrap();
    let long_name = "n".repeat(513);
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (
            vec!["--url".into(), "carrier-pigeon://coop".into(), "ls".into()],
            125,
            "unknown scheme",
        ),
        (
            vec!["--url".into(), "locks.db".into(), "ls".into()],
            125,
            "expected SCHEME://",
        ),
        (
            vec![
                "--url".into(),
                format!("sqlite://{}", env.dir.path().display()),
                "ls".into(),
            ],
            125,
            "is a directory",
        ),
        (
            vec![
                "--url".into(),
                format!("sqlite://{}", text_file.display()),
                "ls".into(),
            ],
            125,
            "not a SQLite database",
        ),
        (
            vec!["--url".into(), format!("{}?bogus=1", env.url), "ls".into()],
            125,
            "unknown option",
        ),
        (
            vec!["run".into(), "".into(), "--".into(), "true".into()],
            125,
            "name is empty",
        ),
        (
            vec![
                "run".into(),
                "--permits".into(),
                "0".into(),
                "p".into(),
                "--".into(),
                "true".into(),
            ],
            125,
            "must be 1..=1024",
        ),
        (
            vec![
                "hold".into(),
                "--permits".into(),
                "2".into(),
                "--fair".into(),
                "p".into(),
            ],
            2,
            "cannot be used with",
        ),
        (
            vec!["run".into(), long_name.clone(), "--".into(), "true".into()],
            125,
            "longer than 512 bytes",
        ),
        (
            vec![
                "run".into(),
                "--ttl".into(),
                "0s".into(),
                "x".into(),
                "--".into(),
                "true".into(),
            ],
            125,
            "greater than zero",
        ),
        (
            vec![
                "run".into(),
                "--ttl".into(),
                "100days".into(),
                "x".into(),
                "--".into(),
                "true".into(),
            ],
            125,
            "maximum",
        ),
        (
            vec![
                "run".into(),
                "--ttl".into(),
                "soon".into(),
                "x".into(),
                "--".into(),
                "true".into(),
            ],
            2,
            "examples: 500ms",
        ),
        (
            vec![
                "run".into(),
                "--wait".into(),
                "1s".into(),
                "--no-wait".into(),
                "x".into(),
                "--".into(),
                "true".into(),
            ],
            2,
            "cannot be used with",
        ),
        (vec!["run".into(), "x".into()], 2, "COMMAND"),
        (
            vec!["hold".into(), "--ttl".into(), "1ms".into(), "x".into()],
            125,
            "below the minimum",
        ),
        (vec!["inspect".into(), "".into()], 125, "name is empty"),
        (
            vec!["break".into(), "--yes".into(), "a\0b".into()],
            125,
            "NUL",
        ),
        (
            vec![
                "--label".into(),
                "l".repeat(300),
                "run".into(),
                "x".into(),
                "--".into(),
                "true".into(),
            ],
            125,
            "owner label",
        ),
        (
            vec!["bench".into(), "--scenario".into(), "nope".into()],
            2,
            "invalid value",
        ),
        (vec!["frobnicate".into()], 2, "unrecognized subcommand"),
    ];
    for (args, code, message) in cases {
        let out = env.cmd().args(&args).output();
        let out = match out {
            Ok(out) => out,
            // A NUL byte cannot even be passed as an argument: the OS refuses, which is fine.
            Err(e) if args.iter().any(|a| a.contains('\0')) => {
                assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
                continue;
            }
            Err(e) => panic!("{args:?}: {e}"),
        };
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(
            err.contains(message),
            "{args:?}: expected {message:?} in {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    assert!(env.held().is_empty(), "bad input left a lock behind");
    assert_eq!(
        std::fs::read_to_string(&text_file).unwrap(),
        "not a database"
    );
}

/// Root ignores file permissions, so the unreadable-file case runs as `nobody` when we are root.
#[test]
fn an_unreadable_database_is_permission_denied() {
    let env = Env::new();
    assert!(env.run(&["run", "x", "--", "true"]).status.success());
    let db = env.path("locks.db");
    let is_root = nix::unistd::geteuid().is_root();
    let mut cmd = if is_root {
        if Command::new("setpriv").arg("--version").output().is_err() {
            panic!("setpriv (util-linux) is needed to test permissions as root");
        }
        // nobody must be able to reach the file's directory, just not the file.
        std::fs::set_permissions(
            env.dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_dlock"));
        cmd
    } else {
        Command::new(env!("CARGO_BIN_EXE_dlock"))
    };
    std::fs::set_permissions(&db, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    if !is_root {
        std::fs::set_permissions(&db, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    }
    let out = cmd.args(["--url", &env.url, "ls"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("permission denied"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::set_permissions(&db, std::os::unix::fs::PermissionsExt::from_mode(0o644));
}

const SECRET: &str = "Pw-s3cret";

/// `--help` never prints the URL it found in the environment (clap shows env values by default).
#[test]
fn help_never_shows_a_url_from_the_environment() {
    for args in [vec!["--help"], vec!["run", "--help"], vec!["ls", "--help"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
            .env("DLOCK_URL", format!("redis://:{SECRET}@127.0.0.1:6379"))
            .env("DLOCK_LABEL", format!("label-{SECRET}"))
            .args(&args)
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
        assert!(out.status.success(), "{args:?}: {text}");
        assert!(!text.contains("s3cret"), "{args:?} shows a secret: {text}");
    }
}

/// An error about a URL names the problem, never the password, in every credential form.
#[test]
fn url_errors_never_show_a_password() {
    let env = Env::new();
    for url in [
        format!("postgres://app@127.0.0.1:1/db?password={SECRET}&bogus=1"),
        format!("redis://u:pa/{SECRET}@127.0.0.1:1"),
        format!("redis://u:{SECRET}@127.0.0.1:1/0?bogus=1"),
        format!("redlock://u:{SECRET}@127.0.0.1:1,u:{SECRET}@127.0.0.1:1"),
    ] {
        let out = env.run(&["--url", &url, "ls"]);
        assert!(!out.status.success(), "{url}");
        assert!(!stderr(&out).contains("s3cret"), "{url}: {}", stderr(&out));
        if stderr(&out).contains("invalid URL") {
            assert!(stderr(&out).contains("***"), "{url}: {}", stderr(&out));
        }
    }
}

/// Lock names, labels and hosts come from whoever took the lock: the human output shows their
/// control characters escaped, so none reaches the terminal; JSON keeps them exact.
#[test]
fn names_and_labels_with_escape_sequences_never_reach_the_terminal() {
    let env = Env::new();
    let name = "evil\u{1b}[2J\u{1b}]0;pwned\u{7}";
    let label = "lbl\u{1b}[31m\u{202e}";
    let mut holder = env
        .cmd()
        .args(["--label", label, "hold", name])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = [0u8; 11];
    holder.stdout.take().unwrap().read_exact(&mut line).unwrap();
    let outputs = [
        env.run(&["ls"]),
        env.run(&["inspect", name]),
        env.run(&["run", "--no-wait", name, "--", "true"]),
        env.run(&["break", name]),
        env.run(&["--label", label, "break", "--yes", name]),
        env.run(&["inspect", name]),
    ];
    for out in &outputs {
        for text in [&out.stdout, &out.stderr] {
            let text = String::from_utf8_lossy(text);
            assert!(
                !text.contains('\u{1b}') && !text.contains('\u{7}') && !text.contains('\u{202e}'),
                "raw control characters printed: {text:?}"
            );
        }
    }
    let shown = String::from_utf8_lossy(&outputs[0].stdout);
    assert!(shown.contains("evil\\u{1b}[2J"), "{shown}");
    assert!(String::from_utf8_lossy(&outputs[3].stderr).contains("evil\\u{1b}"));
    holder.kill().unwrap();
    holder.wait().unwrap();

    // JSON is exact.
    let mut holder = env
        .cmd()
        .args(["--label", label, "hold", name])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    holder.stdout.take().unwrap().read_exact(&mut line).unwrap();
    let held = env.held();
    assert_eq!(held[0]["name"], name);
    assert_eq!(held[0]["label"], label);
    holder.kill().unwrap();
    holder.wait().unwrap();
}

/// A negative duration gets a message about durations, not clap's "unexpected argument".
#[test]
fn a_negative_duration_is_named_as_such() {
    let env = Env::new();
    for flag in ["--wait", "--ttl", "--max-hold", "--kill-after"] {
        let out = env.run(&["run", flag, "-1s", "x", "--", "true"]);
        assert_eq!(out.status.code(), Some(2), "{flag}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("negative"),
            "{flag}: {}",
            stderr(&out)
        );
        assert!(
            !stderr(&out).contains("unexpected argument"),
            "{}",
            stderr(&out)
        );
    }
    assert!(env.held().is_empty());
}

/// The pids a shell command wrote, one a line, once all `count` are there.
fn read_pids(path: &std::path::Path, count: usize) -> Vec<i32> {
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
            pids.len() >= count
        },
    );
    pids
}

/// Gone, or a zombie nobody has reaped yet.
fn is_dead(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| stat.contains(") Z "))
}

/// A command that starts background workers and waits for them; `ignore_term` makes every
/// process of it ignore SIGTERM (an ignored signal is inherited through fork and exec).
fn worker_tree(pids: &std::path::Path, ignore_term: bool) -> Vec<String> {
    let trap = if ignore_term { "trap '' TERM; " } else { "" };
    let p = pids.display();
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "{trap}sleep 300 & echo $! >> {p}; sleep 300 & echo $! >> {p}; echo $$ >> {p}; wait"
        ),
    ]
}

#[test]
fn a_lost_lock_stops_every_process_the_command_started() {
    let env = Env::new();
    let pids_file = env.path("pids");
    let mut run = env
        .cmd()
        .args(["run", "--ttl", "300ms", "tree", "--"])
        .args(worker_tree(&pids_file, false))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pids = read_pids(&pids_file, 3);
    assert!(env.run(&["break", "--yes", "tree"]).status.success());
    wait_with_timeout(&mut run, Duration::from_secs(10));
    eventually(
        Duration::from_secs(10),
        "a worker outlived the lost lock",
        || pids.iter().all(|&pid| is_dead(pid)),
    );
}

#[test]
fn kill_after_reaches_every_process_that_ignores_the_first_signal() {
    let env = Env::new();
    let pids_file = env.path("pids");
    let mut run = env
        .cmd()
        .args([
            "run",
            "--ttl",
            "300ms",
            "--kill-after",
            "300ms",
            "tree",
            "--",
        ])
        .args(worker_tree(&pids_file, true))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pids = read_pids(&pids_file, 3);
    assert!(env.run(&["break", "--yes", "tree"]).status.success());
    let status = wait_with_timeout(&mut run, Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + 9));
    eventually(
        Duration::from_secs(10),
        "a worker survived --kill-after",
        || pids.iter().all(|&pid| is_dead(pid)),
    );
}

#[test]
fn a_killed_dlock_takes_every_process_of_its_command_down() {
    let env = Env::new();
    let pids_file = env.path("pids");
    let mut run = env
        .cmd()
        .args(["run", "--kill-after", "300ms", "tree", "--"])
        .args(worker_tree(&pids_file, true))
        .spawn()
        .unwrap();
    let pids = read_pids(&pids_file, 3);
    run.kill().unwrap();
    run.wait().unwrap();
    eventually(
        Duration::from_secs(10),
        "a worker outlived a SIGKILLed dlock",
        || pids.iter().all(|&pid| is_dead(pid)),
    );
}

/// Processes the command left running after it ended normally are its business: dlock does
/// not signal a group whose leader exited cleanly.
#[test]
fn a_normal_exit_leaves_background_processes_alone() {
    let env = Env::new();
    let pids_file = env.path("pids");
    let p = pids_file.display();
    let out = env.run(&[
        "run",
        "tree",
        "--",
        "sh",
        "-c",
        &format!("sleep 300 > /dev/null 2>&1 & echo $! >> {p}"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let pids = read_pids(&pids_file, 1);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !is_dead(pids[0]),
        "a background process was killed after a clean exit"
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[0]),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// On a terminal the command's group gets the terminal: Ctrl-C (typed into a pseudo-terminal
/// that `script` provides) reaches the command once, and dlock returns its exit code.
#[test]
fn ctrl_c_on_a_terminal_reaches_the_command() {
    let env = Env::new();
    let inner = format!(
        "DLOCK_URL='{}' '{}' run tty-job -- sh -c 'trap \"echo got-int; exit 9\" INT; echo ready; while :; do sleep 0.05; done'",
        env.url,
        env!("CARGO_BIN_EXE_dlock")
    );
    let mut script = Command::new("script")
        .args(["-q", "-e", "-c", &inner, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("script (bsdutils) runs the command on a pseudo-terminal");
    let mut stdout = script.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("ready") {
        let n = stdout.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "the command never started: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    std::io::Write::write_all(script.stdin.as_mut().unwrap(), b"\x03").unwrap();
    let status = wait_with_timeout(&mut script, Duration::from_secs(10));
    let mut rest = String::new();
    let _ = stdout.read_to_string(&mut rest);
    assert_eq!(status.code(), Some(9), "{rest}");
    assert_eq!(rest.matches("got-int").count(), 1, "{rest}");
    assert!(env.held().is_empty(), "the lock outlived the command");
}

fn dlock_output(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `--version` (and `-V`) name the version and every backend this build connects to (the CLI
/// enables them all), each once however many schemes it answers to: the driver table's
/// names, as the library built with every backend (this test's) lists them.
#[test]
fn version_names_the_version_and_the_backends() {
    let backends = dlock::enabled_backends();
    assert!(
        backends.starts_with(&["memory", "sqlite", "redis", "redlock"]),
        "{backends:?}"
    );
    for flag in ["--version", "-V"] {
        let out = dlock_output(&[flag]);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        let expected = format!(
            "dlock {} (backends: {})\n",
            env!("CARGO_PKG_VERSION"),
            backends.join(", ")
        );
        assert_eq!(text, expected);
    }
}

/// Completions for each shell come from the command definition: they offer the commands and
/// the global options, and never the internal `__guard`.
#[test]
fn completions_for_each_shell_offer_the_commands_but_not_the_internal_one() {
    for shell in ["bash", "zsh", "fish"] {
        let out = dlock_output(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(!script.trim().is_empty(), "{shell}: empty");
        // Options without their dashes: fish writes `-l no-wait`.
        for word in [
            "run",
            "hold",
            "inspect",
            "break",
            "completions",
            "url",
            "no-wait",
        ] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
        assert!(
            !script.contains("__guard"),
            "{shell} completions offer __guard"
        );
        assert!(
            !script.contains("Internal: started by"),
            "{shell} completions describe __guard"
        );
    }
    let out = dlock_output(&["completions", "tcsh"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
    assert!(stderr(&out).contains("bash"), "{}", stderr(&out));
}

/// The man page is roff generated from the same definition: a title line, every public
/// command, the options, and no internal command; a command's own page too.
#[test]
fn man_page_is_roff_with_every_public_command() {
    let out = dlock_output(&["man"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = String::from_utf8_lossy(&out.stdout);
    let title = page
        .lines()
        .find(|line| line.starts_with(".TH "))
        .expect("a .TH title line");
    assert!(
        title.to_ascii_uppercase().starts_with(".TH DLOCK 1"),
        "{title}"
    );
    assert!(title.contains(env!("CARGO_PKG_VERSION")), "{title}");
    for section in [".SH NAME", ".SH SYNOPSIS", ".SH OPTIONS", ".SH SUBCOMMANDS"] {
        assert!(page.contains(section), "no {section} in\n{page}");
    }
    for command in [
        "run",
        "hold",
        "ls",
        "inspect",
        "break",
        "bench",
        "demo",
        "completions",
        "man",
    ] {
        assert!(
            page.contains(&format!("dlock\\-{command}(1)")),
            "no {command} in the man page"
        );
    }
    assert!(page.contains("\\-\\-url"), "no --url in the man page");
    assert!(!page.contains("__guard"), "the man page shows __guard");
    assert!(
        !page.contains("Internal: started by"),
        "the man page describes __guard"
    );

    let out = dlock_output(&["man", "run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(
        page.to_ascii_uppercase().contains(".TH DLOCK-RUN 1")
            || page.to_ascii_uppercase().contains(".TH DLOCK\\-RUN 1"),
        "{page}"
    );
    assert!(page.contains("\\-\\-no\\-wait"), "{page}");

    let out = dlock_output(&["man", "__guard"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("no command"), "{}", stderr(&out));
}

#[test]
fn shared_holders_run_together_and_exclude_an_exclusive_one() {
    let env = Env::new();
    // Two --shared holders at once: the second is not kept out by the first.
    let mut first = env
        .cmd()
        .args(["run", "--shared", "catalog", "--", "sleep", "30"])
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(10), "the first reader holds", || {
        !env.held().is_empty()
    });
    let out = env.run(&["run", "--shared", "--no-wait", "catalog", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // A writer is busy beside a reader, with the default code and with one of its own.
    let out = env.run(&["run", "--exclusive", "--no-wait", "catalog", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("read-write lock catalog is held"),
        "{}",
        stderr(&out)
    );
    let out = env.run(&[
        "run",
        "--exclusive",
        "--no-wait",
        "--busy-exit",
        "3",
        "catalog",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    first.kill().unwrap();
    first.wait().unwrap();
    // The reader's process is gone: its hold frees with its lease, then a writer gets in and
    // keeps readers out.
    let reader = format!(
        "'{}' run --shared --no-wait catalog -- true; echo $?",
        env!("CARGO_BIN_EXE_dlock")
    );
    let out = env.run(&[
        "run",
        "--exclusive",
        "--wait",
        "40s",
        "catalog",
        "--",
        "sh",
        "-c",
        &reader,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "75\n");
}

#[test]
fn lost_exit_chooses_the_code_of_a_success_after_a_loss() {
    let env = Env::new();
    let mut run = env
        .cmd()
        .args([
            "run",
            "--ttl",
            "300ms",
            "--on-lost",
            "ignore",
            "--lost-exit",
            "9",
            "fragile",
            "--",
            "sleep",
            "1",
        ])
        .spawn()
        .unwrap();
    wait_until_held(&env, "fragile");
    assert!(env.run(&["break", "--yes", "fragile"]).status.success());
    let status = wait_with_timeout(&mut run, Duration::from_secs(10));
    assert_eq!(status.code(), Some(9));
}

#[test]
fn a_side_of_a_read_write_lock_is_no_semaphore_and_codes_are_bytes() {
    let env = Env::new();
    for args in [
        &["run", "--shared", "--permits", "2", "x", "--", "true"][..],
        &["run", "--shared", "--exclusive", "x", "--", "true"],
        &["run", "--exclusive", "--fair", "x", "--", "true"],
        &["run", "--busy-exit", "256", "x", "--", "true"],
        &["run", "--lost-exit=-1", "x", "--", "true"],
    ] {
        let out = env.run(args);
        assert!(!out.status.success(), "{args:?} was accepted");
        let said = stderr(&out);
        assert!(
            said.contains("cannot be used with") || said.contains("invalid value"),
            "{args:?}: {said}"
        );
        assert!(!said.contains("panicked"), "{args:?}: {said}");
    }
    assert!(env.held().is_empty(), "a refused run left a lock");
}
