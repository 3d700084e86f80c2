#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! `dlock demo`: the seed scenarios run by many worker processes and checked by the demo.

use std::process::{Command, Output, Stdio};

fn demo(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dlock"))
        .arg("--url")
        .arg(url)
        .arg("demo")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn field(out: &str, label: &str) -> u64 {
    let line = out
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{out}"));
    line[label.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn check_seckill(url: &str, items: &str) {
    let out = demo(
        url,
        &[
            "seckill",
            "--workers",
            "4",
            "--stock",
            "20",
            "--buyers",
            "60",
            "--items",
            items,
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(field(&stdout, "sold"), 20, "{stdout}");
    assert_eq!(field(&stdout, "rejected"), 40, "{stdout}");
    assert_eq!(field(&stdout, "oversold"), 0, "{stdout}");
    assert_eq!(field(&stdout, "left"), 0, "{stdout}");
}

#[test]
fn seckill_sells_exactly_the_stock_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    check_seckill(&url, "1");
    check_seckill(&url, "5");
}

#[test]
fn seckill_runs_in_process_on_memory() {
    check_seckill("memory://", "3");
}

#[test]
fn scheduler_runs_every_job_once_per_period() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let out = demo(
        &url,
        &[
            "scheduler",
            "--workers",
            "3",
            "--jobs",
            "4",
            "--period",
            "300ms",
            "--periods",
            "3",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("12 runs for 4 jobs × 3 periods: every job ran exactly once"),
        "{stdout}"
    );
    let log_lines = stdout
        .lines()
        .skip_while(|l| !l.starts_with("run log"))
        .skip(1);
    assert_eq!(
        log_lines.take_while(|l| l.starts_with("  ")).count(),
        12,
        "{stdout}"
    );
}

#[test]
fn demo_rejects_bad_arguments_with_a_message() {
    let out = demo("memory://", &["seckill", "--workers", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--workers"));
    let out = demo("memory://", &["scheduler", "--period", "1ms"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--period"));
}

#[test]
fn elected_scheduler_replaces_a_leader_killed_mid_run_and_runs_every_job_once_per_period() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let out = demo(
        &url,
        &[
            "elected-scheduler",
            "--workers",
            "3",
            "--jobs",
            "4",
            "--periods",
            "5",
            "--period",
            "1s",
            "--lease",
            "1s",
            "--kill-leader-at",
            "2",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("killed the leader"), "{stdout}");
    assert!(
        stdout.contains("the next leader ran its first job"),
        "{stdout}"
    );
    assert!(
        stdout.contains("every job ran exactly once per period"),
        "{stdout}"
    );
    assert!(!stdout.contains("VIOLATION"), "{stdout}");
}
