//! `dlock bench --report DIR`: BENCHMARKS.md and its charts from the JSON reports of a run.
//!
//! Layout: `DIR/*.json` are the reports, `DIR/../charts/` receives the charts, and
//! `DIR/../notes.md` (hand-written: what the numbers mean, how they got there) is appended.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::charts::{self, Series};
use crate::results::{
    CpuPerPair, Floor, Handoff, HolderGaps, ManyLocks, ManyPoint, Report, Uncontended,
    WatchdogScale,
};
use crate::stats::{QUANTILES, Spread};

/// The measurements of one library on one store, merged from every report about it.
#[derive(Default)]
struct Entry {
    uncontended: Option<(Uncontended, String)>,
    floor: Option<Floor>,
    references: Vec<Floor>,
    many: Option<ManyLocks>,
    handoff: Option<(Handoff, String)>,
    watchdog: Option<WatchdogScale>,
}

/// Every report about one library on one store: `scripts/bench.sh` runs the libraries in
/// rounds, so that a change in the machine's load falls on all of them alike.
#[derive(Default)]
struct Rounds {
    uncontended: Vec<Uncontended>,
    uncontended_place: String,
    floor: Vec<Floor>,
    references: Vec<Vec<Floor>>,
    many: Vec<ManyLocks>,
    handoff: Vec<Handoff>,
    handoff_place: String,
    watchdog: Vec<WatchdogScale>,
}

/// One spread from several reports: a single report keeps its own (min, median, max of its
/// runs); several give the min, median and max of their medians.
fn merge_spreads<'a>(spreads: impl IntoIterator<Item = &'a Spread>) -> Spread {
    let spreads: Vec<&Spread> = spreads.into_iter().collect();
    match spreads[..] {
        [single] => single.clone(),
        _ => Spread::of(spreads.iter().map(|s| s.median).collect()),
    }
}

/// One spread from the reports that have it; `None` when none has.
fn merge_optional<'a>(spreads: impl IntoIterator<Item = Option<&'a Spread>>) -> Option<Spread> {
    let spreads: Vec<&Spread> = spreads.into_iter().flatten().collect();
    (!spreads.is_empty()).then(|| merge_spreads(spreads))
}

/// One CPU-per-pair figure from the reports that have it.
fn merge_cpu<'a>(cpus: impl IntoIterator<Item = Option<&'a CpuPerPair>>) -> Option<CpuPerPair> {
    let cpus: Vec<&CpuPerPair> = cpus.into_iter().flatten().collect();
    (!cpus.is_empty()).then(|| CpuPerPair {
        client_us: merge_spreads(cpus.iter().map(|c| &c.client_us)),
        server_us: merge_optional(cpus.iter().map(|c| c.server_us.as_ref())),
    })
}

/// One floor from the reports of several rounds.
fn merge_floors(floors: &[Floor]) -> Option<Floor> {
    let first = floors.first()?;
    Some(Floor {
        what: first.what.clone(),
        pairs_per_sec: merge_spreads(floors.iter().map(|f| &f.pairs_per_sec)),
        p50_us: merge_spreads(floors.iter().map(|f| &f.p50_us)),
        p99_us: merge_spreads(floors.iter().map(|f| &f.p99_us)),
        lock_ratio: merge_optional(floors.iter().map(|f| f.lock_ratio.as_ref())),
        cpu: merge_cpu(floors.iter().map(|f| f.cpu.as_ref())),
    })
}

impl Rounds {
    fn merge(self) -> Entry {
        let uncontended = (!self.uncontended.is_empty()).then(|| {
            let u = &self.uncontended;
            let ratios: Vec<&Spread> = u.iter().filter_map(|u| u.ratio_to_floor.as_ref()).collect();
            (
                Uncontended {
                    pairs: u[0].pairs,
                    pairs_per_sec: merge_spreads(u.iter().map(|u| &u.pairs_per_sec)),
                    p50_us: merge_spreads(u.iter().map(|u| &u.p50_us)),
                    p99_us: merge_spreads(u.iter().map(|u| &u.p99_us)),
                    ratio_to_floor: (!ratios.is_empty()).then(|| merge_spreads(ratios)),
                    cpu: merge_cpu(u.iter().map(|u| u.cpu.as_ref())),
                },
                self.uncontended_place.clone(),
            )
        });
        let floor = merge_floors(&self.floor);
        // References by position: every report of one backend measures the same ones.
        let references = (0..self.references.iter().map(Vec::len).max().unwrap_or(0))
            .filter_map(|i| {
                let same: Vec<Floor> = self
                    .references
                    .iter()
                    .filter_map(|r| r.get(i).cloned())
                    .collect();
                merge_floors(&same)
            })
            .collect();
        let many = self.many.first().map(|first| ManyLocks {
            points: first
                .points
                .iter()
                .enumerate()
                .map(|(i, point)| {
                    let same: Vec<&crate::results::ManyPoint> =
                        self.many.iter().filter_map(|m| m.points.get(i)).collect();
                    crate::results::ManyPoint {
                        tasks: point.tasks,
                        pairs_per_sec: merge_spreads(same.iter().map(|p| &p.pairs_per_sec)),
                        p50_us: merge_spreads(same.iter().map(|p| &p.p50_us)),
                        p99_us: merge_spreads(same.iter().map(|p| &p.p99_us)),
                        floor_pairs_per_sec: merge_optional(
                            same.iter().map(|p| p.floor_pairs_per_sec.as_ref()),
                        ),
                        ratio_to_floor: merge_optional(
                            same.iter().map(|p| p.ratio_to_floor.as_ref()),
                        ),
                        server_us_per_pair: merge_optional(
                            same.iter().map(|p| p.server_us_per_pair.as_ref()),
                        ),
                        floor_server_us_per_pair: merge_optional(
                            same.iter().map(|p| p.floor_server_us_per_pair.as_ref()),
                        ),
                    }
                })
                .collect(),
        });
        let handoff = self.handoff.first().map(|first| {
            let h = &self.handoff;
            let commands: Vec<&Spread> = h
                .iter()
                .filter_map(|h| h.store_commands_per_acquisition.as_ref())
                .collect();
            // The distributions of the rounds, averaged quantile by quantile.
            let quantiles = (0..first.gap_quantiles_us.len())
                .map(|i| {
                    let values: Vec<f64> = h
                        .iter()
                        .filter_map(|h| h.gap_quantiles_us.get(i).copied())
                        .collect();
                    values.iter().sum::<f64>() / values.len().max(1) as f64
                })
                .collect();
            (
                Handoff {
                    processes: first.processes,
                    hold_ms: first.hold_ms,
                    acquisitions_per_sec: merge_spreads(h.iter().map(|h| &h.acquisitions_per_sec)),
                    handoffs_per_sec: merge_spreads(h.iter().map(|h| &h.handoffs_per_sec)),
                    gap_p50_us: merge_spreads(h.iter().map(|h| &h.gap_p50_us)),
                    gap_p99_us: merge_spreads(h.iter().map(|h| &h.gap_p99_us)),
                    holder_gaps: {
                        let gaps: Vec<&HolderGaps> =
                            h.iter().filter_map(|h| h.holder_gaps.as_ref()).collect();
                        (!gaps.is_empty()).then(|| HolderGaps {
                            p50_us: merge_spreads(gaps.iter().map(|g| &g.p50_us)),
                            p99_us: merge_spreads(gaps.iter().map(|g| &g.p99_us)),
                            max_us: merge_spreads(gaps.iter().map(|g| &g.max_us)),
                            count: merge_optional(gaps.iter().map(|g| g.count.as_ref())),
                            retake_share: merge_optional(
                                gaps.iter().map(|g| g.retake_share.as_ref()),
                            ),
                        })
                    },
                    fairness: merge_spreads(h.iter().map(|h| &h.fairness)),
                    worst_wait_ms: merge_spreads(h.iter().map(|h| &h.worst_wait_ms)),
                    store_commands_per_acquisition: (!commands.is_empty())
                        .then(|| merge_spreads(commands)),
                    gap_quantiles_us: quantiles,
                },
                self.handoff_place.clone(),
            )
        });
        let watchdog = self.watchdog.first().map(|first| {
            let w = &self.watchdog;
            let rss: Vec<&Spread> = w.iter().filter_map(|w| w.rss_mib.as_ref()).collect();
            WatchdogScale {
                held: first.held,
                lease_ms: first.lease_ms,
                renewals_per_sec: merge_spreads(w.iter().map(|w| &w.renewals_per_sec)),
                cpu_percent: merge_spreads(w.iter().map(|w| &w.cpu_percent)),
                rss_growth_mib: merge_spreads(w.iter().map(|w| &w.rss_growth_mib)),
                rss_mib: (!rss.is_empty()).then(|| merge_spreads(rss)),
                // Measured once per report file; several files keep the first.
                serve: w.iter().find_map(|w| w.serve.clone()),
                lost: w.iter().map(|w| w.lost).sum(),
            }
        });
        Entry {
            uncontended,
            floor,
            references,
            many,
            handoff,
            watchdog,
        }
    }
}

/// (backend, library) → what was measured; dlock first within a backend.
type Entries = BTreeMap<(String, (bool, String)), Entry>;

/// What a ratio between two libraries taken round by round needs from one report.
#[derive(Default, Clone, Copy)]
struct RoundFigures {
    /// Uncontended pairs/s (the median of the report's runs).
    pairs_per_sec: Option<f64>,
    /// Hand-off gap between different holders, p99 µs (the median of the report's runs).
    holder_gap_p99_us: Option<f64>,
    /// Hand-offs (to another worker) per second (the median of the report's runs).
    handoffs_per_sec: Option<f64>,
}

/// (backend, library) → round → figures. Rounds come from the reports' file names
/// (`redis-py-sync-0.1-handoff.r3.json` is round 3), as `scripts/bench.sh` writes them.
type PerRound = BTreeMap<(String, String), BTreeMap<u32, RoundFigures>>;

/// The round of a report from its file name, `NAME.rN.json`.
fn round_of(file: &Path) -> Option<u32> {
    let stem = file.file_stem()?.to_str()?;
    stem.rsplit_once(".r")?.1.parse().ok()
}

/// `numerator / denominator` in each round where both were measured, as a spread over rounds.
fn per_round_ratio(
    per_round: &PerRound,
    backend: &str,
    numerator: &dyn Fn(u32) -> Option<f64>,
    denominator: &dyn Fn(u32) -> Option<f64>,
) -> Option<Spread> {
    let rounds: std::collections::BTreeSet<u32> = per_round
        .iter()
        .filter(|((b, _), _)| b == backend)
        .flat_map(|(_, rounds)| rounds.keys().copied())
        .collect();
    let ratios: Vec<f64> = rounds
        .into_iter()
        .filter_map(|r| Some(numerator(r)? / denominator(r)?))
        .filter(|ratio| ratio.is_finite())
        .collect();
    (!ratios.is_empty()).then(|| Spread::of(ratios))
}

fn key(report: &Report) -> (String, (bool, String)) {
    (
        report.backend.clone(),
        (report.library != "dlock", report.library.clone()),
    )
}

fn placement(report: &Report) -> String {
    let env = &report.environment;
    match &env.server_cpus {
        Some(server) => format!("client CPU {}, server CPU {server}", env.client_cpus),
        None => format!("client CPU {}", env.client_cpus),
    }
}

/// One run of `scripts/bench.sh`, as far as its reports tell.
struct Run {
    first: u64,
    last: u64,
    load_min: f64,
    load_max: f64,
    backends: std::collections::BTreeSet<String>,
    rounds: usize,
}

/// Reports more than this apart belong to different runs (a whole run takes minutes).
const RUN_BREAK_S: u64 = 30 * 60;

/// The runs behind `reports`: `BENCH_STORES=… scripts/bench.sh` replaces the reports of some
/// stores and keeps the others, so one BENCHMARKS.md may combine runs of different days.
fn runs(reports: &[(Report, Option<u32>)]) -> Vec<Run> {
    let mut by_time: Vec<&(Report, Option<u32>)> = reports.iter().collect();
    by_time.sort_by_key(|(r, _)| r.environment.started_unix_s);
    let mut runs: Vec<Run> = Vec::new();
    for (report, round) in by_time {
        let env = &report.environment;
        let starts_new = runs
            .last()
            .is_none_or(|run| env.started_unix_s > run.last + RUN_BREAK_S);
        if starts_new {
            runs.push(Run {
                first: env.started_unix_s,
                last: env.started_unix_s,
                load_min: f64::MAX,
                load_max: f64::MIN,
                backends: Default::default(),
                rounds: 0,
            });
        }
        let Some(run) = runs.last_mut() else {
            continue;
        };
        run.last = env.started_unix_s;
        for load in [env.load_start, env.load_end] {
            if load.is_finite() {
                run.load_min = run.load_min.min(load);
                run.load_max = run.load_max.max(load);
            }
        }
        run.backends.insert(report.backend.clone());
        run.rounds = run.rounds.max(round.unwrap_or(1) as usize);
    }
    runs
}

/// Reads every report in `results`, writes `out` and the charts.
pub(crate) fn write(results: &Path, out: &Path) -> anyhow::Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(results)
        .with_context(|| format!("read {}", results.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    let mut reports = Vec::new();
    let mut per_round = PerRound::new();
    for file in &files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
        let report: Report =
            serde_json::from_str(&text).with_context(|| format!("parse {}", file.display()))?;
        if let Some(round) = round_of(file) {
            let figures = per_round
                .entry((report.backend.clone(), report.library.clone()))
                .or_default()
                .entry(round)
                .or_default();
            if let Some(u) = &report.uncontended {
                figures.pairs_per_sec = Some(u.pairs_per_sec.median);
            }
            if let Some(g) = report.handoff.as_ref().and_then(|h| h.holder_gaps.as_ref()) {
                figures.holder_gap_p99_us = Some(g.p99_us.median);
            }
            if let Some(h) = &report.handoff {
                figures.handoffs_per_sec = Some(h.handoffs_per_sec.median);
            }
        }
        reports.push((report, round_of(file)));
    }
    anyhow::ensure!(
        !reports.is_empty(),
        "no JSON reports in {}",
        results.display()
    );
    let mut rounds: BTreeMap<_, Rounds> = BTreeMap::new();
    let runs = runs(&reports);
    let mut cpus = 0;
    // The dlock binary of the latest run that recorded its size.
    let mut binary: Option<(u64, u64)> = None;
    for (report, _) in reports {
        cpus = cpus.max(report.environment.cpus);
        if let Some(bytes) = report.environment.binary_bytes {
            let started = report.environment.started_unix_s;
            if binary.is_none_or(|(at, _)| started >= at) {
                binary = Some((started, bytes));
            }
        }
        let place = placement(&report);
        let entry = rounds.entry(key(&report)).or_default();
        if let Some(u) = report.uncontended {
            entry.uncontended.push(u);
            entry.uncontended_place = place.clone();
        }
        entry.floor.extend(report.floor);
        if !report.references.is_empty() {
            entry.references.push(report.references);
        }
        entry.many.extend(report.many);
        if let Some(h) = report.handoff {
            entry.handoff.push(h);
            entry.handoff_place = place;
        }
        entry.watchdog.extend(report.watchdog);
    }
    let entries: Entries = rounds
        .into_iter()
        .map(|(key, rounds)| (key, rounds.merge()))
        .collect();
    let base = results.parent().unwrap_or(Path::new("."));
    let charts_dir = base.join("charts");
    std::fs::create_dir_all(&charts_dir)
        .with_context(|| format!("create {}", charts_dir.display()))?;
    let chart_links = draw_charts(&entries, &charts_dir)?;
    let out_dir = out
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let relative = |path: &Path| -> String {
        let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let (path, dir) = (absolute(path), absolute(out_dir));
        path.strip_prefix(&dir)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| path.display().to_string())
    };
    let mut md = String::new();
    let date = |secs: u64| {
        humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs),
        )
        .to_string()
    };
    let when = match &runs[..] {
        [run] => format!(
            "one run of\n`scripts/bench.sh` ({} to {})",
            date(run.first),
            date(run.last)
        ),
        _ => format!("{} runs of\n`scripts/bench.sh` (listed below)", runs.len()),
    };
    let _ = writeln!(
        md,
        "# Benchmarks\n\n\
         Generated by `dlock bench --report {}` from the JSON reports of {when}; do not edit by\n\
         hand: edit `{}` or rerun.\n\n\
         The script runs every library and scenario once per round, all of them in turn, for\n\
         several rounds (3 by default), so that a change in the machine's load falls on all of\n\
         them alike; cells read **median** (min – max) over the rounds. Servers come from the\n\
         test kit (child processes on loopback); the peers were installed from their registries\n\
         by the script and ran on the same server instances as dlock.",
        relative(results),
        relative(&base.join("notes.md")),
    );
    match &runs[..] {
        [run] => {
            let _ = writeln!(
                md,
                "1-minute load average during the run: {:.2} – {:.2} (the machine has {cpus} CPUs).\n",
                run.load_min, run.load_max,
            );
        }
        _ => {
            let _ = writeln!(
                md,
                "Libraries are compared only within a run (a store's reports all come from one).\n\
                 1-minute load average per run (the machine has {cpus} CPUs):\n"
            );
            for run in &runs {
                let stores: Vec<String> = run.backends.iter().map(|b| format!("`{b}`")).collect();
                let _ = writeln!(
                    md,
                    "- {} to {}, {} rounds: {}; load {:.2} – {:.2}",
                    date(run.first),
                    date(run.last),
                    run.rounds,
                    stores.join(", "),
                    run.load_min,
                    run.load_max,
                );
            }
            md.push('\n');
        }
    }
    targets(
        &mut md,
        &entries,
        &per_round,
        binary.map(|(_, bytes)| bytes),
    );
    uncontended_table(&mut md, &entries);
    many_table(
        &mut md,
        &entries,
        chart_links.get("throughput").map(|p| relative(p)),
    );
    handoff_table(
        &mut md,
        &entries,
        chart_links.get("handoff").map(|p| relative(p)),
    );
    watchdog_table(&mut md, &entries);
    python_section(&mut md, &entries, &per_round);
    if let Ok(notes) = std::fs::read_to_string(base.join("notes.md")) {
        md.push('\n');
        md.push_str(&notes);
    }
    std::fs::write(out, md).with_context(|| format!("write {}", out.display()))?;
    println!("wrote {} and {} charts", out.display(), chart_links.len());
    Ok(())
}

/// A number for a table: thousands grouped, fewer decimals as it grows.
fn num(x: f64) -> String {
    if !x.is_finite() {
        return "–".to_owned();
    }
    if x.abs() >= 100.0 {
        let digits = format!("{:.0}", x.abs());
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                grouped.push('\u{202f}');
            }
            grouped.push(c);
        }
        if x < 0.0 {
            format!("-{grouped}")
        } else {
            grouped
        }
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else if x.abs() < 1.0 {
        // Fairness and ratios: 0.99 against 0.985 decides a target.
        format!("{x:.3}")
    } else {
        format!("{x:.2}")
    }
}

fn cell(s: &Spread) -> String {
    format!("**{}** ({} – {})", num(s.median), num(s.min), num(s.max))
}

/// The client and server CPU cells of an uncontended row.
fn cpu_cells(cpu: Option<&CpuPerPair>) -> String {
    format!(
        "{} | {}",
        opt_cell(cpu.map(|c| &c.client_us)),
        opt_cell(cpu.and_then(|c| c.server_us.as_ref()))
    )
}

fn opt_cell(s: Option<&Spread>) -> String {
    s.map_or_else(|| "–".to_owned(), cell)
}

fn find<'a>(entries: &'a Entries, backend: &str, library: &str) -> Option<&'a Entry> {
    entries.get(&(backend.to_owned(), (library != "dlock", library.to_owned())))
}

/// Peers of `backend` whose label starts with `prefix`.
fn peers<'a>(
    entries: &'a Entries,
    backend: &'a str,
    prefix: &'a str,
) -> impl Iterator<Item = (&'a str, &'a Entry)> + 'a {
    entries
        .iter()
        .filter(move |((b, (is_peer, lib)), _)| b == backend && *is_peer && lib.starts_with(prefix))
        .map(|((_, (_, lib)), entry)| (lib.as_str(), entry))
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "not measured",
    }
}

/// The Python package's label in the reports (`scripts/bench.sh`), per mode.
fn python_label(mode: &str) -> String {
    format!("dlock (Python) {mode}")
}

/// redis-py's label in the reports, per mode and polling `sleep`.
fn redis_py_label(mode: &str, sleep: &str) -> String {
    format!("redis-py {mode}, sleep={sleep}")
}

const REDIS_PY_SLEEPS: [&str; 2] = ["0.1", "0.001"];

/// rslock's label in the reports (`scripts/bench.sh`).
const RSLOCK_LIBRARY: &str = "rslock 0.10 (tokio-comp)";

fn figures(per_round: &PerRound, library: &str, round: u32) -> Option<RoundFigures> {
    per_round
        .get(&("redis".to_owned(), library.to_owned()))?
        .get(&round)
        .copied()
}

/// dlock (Python) pairs/s over redis-py's, round by round, against the faster of redis-py's
/// two variants of the same mode in that round (its `sleep` plays no part uncontended).
fn python_pairs_ratio(per_round: &PerRound, mode: &str) -> Option<Spread> {
    let ours = python_label(mode);
    per_round_ratio(
        per_round,
        "redis",
        &|r| figures(per_round, &ours, r)?.pairs_per_sec,
        &|r| {
            REDIS_PY_SLEEPS
                .iter()
                .filter_map(|sleep| {
                    figures(per_round, &redis_py_label(mode, sleep), r)?.pairs_per_sec
                })
                .reduce(f64::max)
        },
    )
}

/// redis-py's hand-off gap p99 (with `sleep`) over dlock (Python)'s, round by round: how
/// many times shorter dlock's is.
fn python_gap_ratio(per_round: &PerRound, mode: &str, sleep: &str) -> Option<Spread> {
    let (ours, theirs) = (python_label(mode), redis_py_label(mode, sleep));
    per_round_ratio(
        per_round,
        "redis",
        &|r| figures(per_round, &theirs, r)?.holder_gap_p99_us,
        &|r| figures(per_round, &ours, r)?.holder_gap_p99_us,
    )
}

fn ratio_cell(s: &Spread) -> String {
    format!("**{}x** ({}x – {}x)", num(s.median), num(s.min), num(s.max))
}

/// The `--library` label of the blocking facade's reports (`scripts/bench.sh`).
const BLOCKING_LIBRARY: &str = "dlock (blocking)";

/// The stores with a floor, in the order the targets table lists them, each with its
/// uncontended target as a fraction of that floor (issue 37; etcd's from issue 36; Redlock
/// keeps the first round's 0.85).
const FLOOR_TARGETS: [(&str, f64); 7] = [
    ("sqlite", 0.80),
    ("redis", 0.80),
    ("redlock", 0.85),
    ("zk", 0.80),
    ("etcd", 0.80),
    ("postgres", 0.85),
    ("mysql", 0.80),
];

/// The library label of the watchdog scenario's run at 100,000 held locks
/// (`scripts/bench.sh`): a row of its own beside the 10,000 one.
const WATCHDOG_100K_LIBRARY: &str = "dlock (100 000 held)";

/// The stores whose 100,000 watched locks must fit in [`WATCHDOG_100K_RSS_MB`] (issue 36).
const WATCHDOG_100K_STORES: [&str; 3] = ["redis", "sqlite", "postgres"];
const WATCHDOG_100K_RSS_MB: f64 = 100.0;

/// The size of the `dlock` binary before issue 22 stripped it, MB.
const UNSTRIPPED_MB: f64 = 116.0;

/// The most the release binary may weigh, MB: a binary without debug info (the 116 MB of
/// line tables it had are for the `profiling` profile).
const BINARY_TARGET_MB: f64 = 32.0;

fn targets<'a>(
    md: &mut String,
    entries: &'a Entries,
    per_round: &PerRound,
    binary_bytes: Option<u64>,
) {
    let _ = writeln!(
        md,
        "## Targets\n\n| target | measured (median, min – max) | verdict |\n|---|---|---|"
    );
    let mut row = |target: &str, measured: String, met: Option<bool>| {
        let _ = writeln!(md, "| {target} | {measured} | {} |", verdict(met));
    };
    for (backend, target) in FLOOR_TARGETS {
        let entry = find(entries, backend, "dlock");
        // Redlock's reports of older versions called its one node the floor: not a floor.
        let floor = entry
            .and_then(|e| e.floor.as_ref())
            .filter(|f| !f.what.contains("one of the nodes"));
        let ratio = entry
            .and_then(|e| e.uncontended.as_ref())
            .and_then(|(u, _)| u.ratio_to_floor.clone())
            .filter(|_| floor.is_some());
        let what = floor.map_or_else(String::new, |f| format!(": {}", f.what));
        row(
            &format!("uncontended ≥ {target:.2} of the floor (`{backend}`{what})"),
            opt_cell(ratio.as_ref()),
            ratio.map(|r| r.median >= target),
        );
    }
    let many_64 = find(entries, "redis", "dlock")
        .and_then(|e| e.many.as_ref())
        .and_then(|m| m.points.iter().find(|p| p.tasks == 64))
        .and_then(|p| p.ratio_to_floor.clone());
    row(
        "many locks: 64 tasks on distinct names ≥ 0.60 of the floor at 64 tasks (`redis`)",
        opt_cell(many_64.as_ref()),
        many_64.map(|r| r.median >= 0.60),
    );
    let blocking = find(entries, "redis", BLOCKING_LIBRARY)
        .and_then(|e| e.uncontended.as_ref())
        .and_then(|(u, _)| u.ratio_to_floor.clone());
    row(
        &format!(
            "blocking facade uncontended ≥ 0.85 of the blocking floor (`redis`: {})",
            crate::scenarios::blocking::FLOOR
        ),
        opt_cell(blocking.as_ref()),
        blocking.map(|r| r.median >= 0.85),
    );
    let redis_peer_ratio = |peer: &dyn Fn(u32) -> Option<f64>| {
        per_round_ratio(
            per_round,
            "redis",
            &|r| figures(per_round, "dlock", r)?.pairs_per_sec,
            peer,
        )
    };
    let rslock = redis_peer_ratio(&|r| figures(per_round, RSLOCK_LIBRARY, r)?.pairs_per_sec);
    row(
        &format!("Redis uncontended ≥ 1.2x {RSLOCK_LIBRARY} (pairs/s, round by round)"),
        rslock.as_ref().map_or_else(|| "–".to_owned(), ratio_cell),
        rslock.map(|r| r.median >= 1.2),
    );
    let redis_py = redis_peer_ratio(&|r| {
        REDIS_PY_SLEEPS
            .iter()
            .filter_map(|sleep| {
                figures(per_round, &redis_py_label("sync", sleep), r)?.pairs_per_sec
            })
            .reduce(f64::max)
    });
    row(
        "Redis uncontended ≥ 2.7x redis-py sync, its faster variant (pairs/s, round by round)",
        redis_py.as_ref().map_or_else(|| "–".to_owned(), ratio_cell),
        redis_py.map(|r| r.median >= 2.7),
    );
    let handoff = find(entries, "redis", "dlock").and_then(|e| e.handoff.as_ref());
    match handoff {
        Some((h, _)) => {
            let gaps = h.holder_gaps.as_ref();
            row(
                &format!(
                    "hand-off gap to another worker p99 ≤ 0.5 ms, {} processes × {} ms holds \
                     (`redis`), µs",
                    h.processes,
                    num(h.hold_ms)
                ),
                opt_cell(gaps.map(|g| &g.p99_us)),
                gaps.map(|g| g.p99_us.median <= 500.0),
            );
            row(
                "hand-off fairness (Jain) ≥ 0.99",
                // Four decimals, cut rather than rounded: 0.98999 must not read as 0.9900.
                {
                    let cut = |x: f64| (x * 1e4).floor() / 1e4;
                    format!(
                        "**{:.4}** ({:.4} – {:.4})",
                        cut(h.fairness.median),
                        cut(h.fairness.min),
                        cut(h.fairness.max)
                    )
                },
                Some(h.fairness.median >= 0.99),
            );
        }
        None => row("hand-off p99 ≤ 0.5 ms, Jain ≥ 0.99", "–".to_owned(), None),
    }
    let mysql = find(entries, "mysql", "dlock").and_then(|e| e.handoff.as_ref());
    row(
        "MySQL/MariaDB: ≥ 300 hand-offs (to another worker) per second",
        opt_cell(mysql.map(|(h, _)| &h.handoffs_per_sec)),
        mysql.map(|(h, _)| h.handoffs_per_sec.median >= 300.0),
    );
    for (backend, label, limit_ms) in [("mysql", "MySQL/MariaDB", 20.0), ("etcd", "etcd", 10.0)] {
        let gaps = find(entries, backend, "dlock")
            .and_then(|e| e.handoff.as_ref())
            .and_then(|(h, _)| h.holder_gaps.as_ref());
        row(
            &format!("{label}: hand-off gap to another worker p99 < {limit_ms} ms, µs"),
            opt_cell(gaps.map(|g| &g.p99_us)),
            gaps.map(|g| g.p99_us.median < limit_ms * 1e3),
        );
    }
    let redlock = find(entries, "redlock", "dlock");
    // One node is a reference beside the floor (before the Redlock floor existed, the floor).
    let one_node = |e: &'a Entry| {
        e.references
            .iter()
            .chain(&e.floor)
            .find(|f| f.what.contains("one of the nodes"))
    };
    match redlock.and_then(|e| Some((e.uncontended.as_ref()?, one_node(e)?))) {
        Some(((u, _), one)) => {
            let ratio = u.p50_us.median / one.p50_us.median;
            row(
                "Redlock over 5 nodes: p50 ≤ 1.5x one node",
                format!(
                    "{}x ({} µs against {} µs)",
                    num(ratio),
                    num(u.p50_us.median),
                    num(one.p50_us.median)
                ),
                Some(ratio <= 1.5),
            );
        }
        None => row(
            "Redlock over 5 nodes: p50 ≤ 1.5x one node",
            "–".to_owned(),
            None,
        ),
    }
    let zk = find(entries, "zk", "dlock").and_then(|e| e.uncontended.as_ref());
    let kazoo = peers(entries, "zk", "kazoo").find_map(|(_, e)| e.uncontended.as_ref());
    match (zk, kazoo) {
        (Some((d, _)), Some((k, _))) => {
            let ratio = d.pairs_per_sec.median / k.pairs_per_sec.median;
            row(
                "ZooKeeper ≥ 2x kazoo (uncontended pairs/s)",
                format!(
                    "{}x ({} against {})",
                    num(ratio),
                    num(d.pairs_per_sec.median),
                    num(k.pairs_per_sec.median)
                ),
                Some(ratio >= 2.0),
            );
        }
        _ => row("ZooKeeper ≥ 2x kazoo", "–".to_owned(), None),
    }
    if let Some((kazoo, _)) = peers(entries, "zk", "kazoo").find(|(_, e)| e.handoff.is_some()) {
        let ratio = per_round_ratio(
            per_round,
            "zk",
            &|r| {
                per_round
                    .get(&("zk".to_owned(), "dlock".to_owned()))?
                    .get(&r)?
                    .handoffs_per_sec
            },
            &|r| {
                per_round
                    .get(&("zk".to_owned(), kazoo.to_owned()))?
                    .get(&r)?
                    .handoffs_per_sec
            },
        );
        row(
            "ZooKeeper ≥ 2x kazoo on hand-off (hand-offs to another worker per second, round by round)",
            ratio.as_ref().map_or_else(|| "–".to_owned(), ratio_cell),
            ratio.map(|r| r.median >= 2.0),
        );
    }
    for mode in ["sync", "asyncio"] {
        if find(entries, "redis", &python_label(mode)).is_none() {
            continue;
        }
        let pairs = python_pairs_ratio(per_round, mode);
        row(
            &format!("Python {mode}: uncontended ≥ 2x redis-py {mode} (pairs/s, round by round)"),
            pairs.as_ref().map_or_else(|| "–".to_owned(), ratio_cell),
            pairs.map(|r| r.median >= 2.0),
        );
        let gap = python_gap_ratio(per_round, mode, "0.1");
        row(
            &format!(
                "Python {mode}: hand-off gap p99 ≥ 20x shorter than redis-py {mode}'s default \
                 (sleep=0.1), round by round"
            ),
            gap.as_ref().map_or_else(|| "–".to_owned(), ratio_cell),
            gap.map(|r| r.median >= 20.0),
        );
    }
    watchdog_targets(&mut row, entries);
    let mb = binary_bytes.map(|b| b as f64 / 1e6);
    row(
        &format!(
            "release `dlock` binary without debug info ≤ {} MB (it was {} MB)",
            num(BINARY_TARGET_MB),
            num(UNSTRIPPED_MB)
        ),
        mb.map_or_else(|| "–".to_owned(), |mb| format!("{} MB", num(mb))),
        mb.map(|mb| mb <= BINARY_TARGET_MB),
    );
    md.push('\n');
}

/// Issue 36's rows: every store's 10,000 watched locks under 1 % of a core with none lost,
/// and 100,000 in under 100 MB on the stores that must hold that many.
fn watchdog_targets(row: &mut dyn FnMut(&str, String, Option<bool>), entries: &Entries) {
    let measured = entries
        .iter()
        .filter_map(|((backend, (_, library)), entry)| {
            Some((backend.as_str(), library.as_str(), entry.watchdog.as_ref()?))
        });
    for (backend, library, w) in measured {
        let held = num(f64::from(w.held));
        if library == "dlock" {
            row(
                &format!("{held} watched locks (`{backend}`): CPU < 1 % of a core, none lost"),
                format!("{} %, {} lost", cell(&w.cpu_percent), w.lost),
                Some(w.cpu_percent.median < 1.0 && w.lost == 0),
            );
        } else if library == WATCHDOG_100K_LIBRARY && WATCHDOG_100K_STORES.contains(&backend) {
            let rss = w.rss_mib.as_ref().unwrap_or(&w.rss_growth_mib);
            row(
                &format!(
                    "{held} watched locks (`{backend}`): RSS < {} MB, none lost",
                    num(WATCHDOG_100K_RSS_MB)
                ),
                format!("{} MiB, {} lost", cell(rss), w.lost),
                Some(rss.median * 1.048_576 < WATCHDOG_100K_RSS_MB && w.lost == 0),
            );
        }
    }
}

fn uncontended_table(md: &mut String, entries: &Entries) {
    let _ = writeln!(
        md,
        "## Uncontended acquire + release (one task, one name)\n\n\
         The floor is the same client library doing plain store operations with no lock logic\n\
         (Redis: `SET NX PX` + `DEL`; Redlock: those sent to every node at once, answered on the\n\
         first majority; SQLite: two write transactions; ZooKeeper: an ephemeral sequential\n\
         create + delete; etcd: a put with a lease granted once + delete; PostgreSQL and MySQL:\n\
         the lease table's two statements without the lock logic), measured in blocks\n\
         alternating with the lock's. References are measured the same way; their last column\n\
         is dlock's rate over theirs. CPU columns: CPU time per pair, µs, of the bench process\n\
         (every thread) and of the store's server processes (children included), read from\n\
         `/proc/PID/task/*/schedstat` around each block.\n\n\
         | store | client | pairs/s | p50 µs | p99 µs | / floor | client CPU µs | server CPU µs | placement |\n|---|---|---:|---:|---:|---:|---:|---:|---|"
    );
    for ((backend, (_, library)), entry) in entries {
        if let Some(floor) = &entry.floor {
            let _ = writeln!(
                md,
                "| `{backend}` | floor: {} | {} | {} | {} | 1 | {} | same |",
                floor.what,
                cell(&floor.pairs_per_sec),
                cell(&floor.p50_us),
                cell(&floor.p99_us),
                cpu_cells(floor.cpu.as_ref())
            );
        }
        for reference in &entry.references {
            let _ = writeln!(
                md,
                "| `{backend}` | reference: {} | {} | {} | {} | dlock / this: {} | {} | same |",
                reference.what,
                cell(&reference.pairs_per_sec),
                cell(&reference.p50_us),
                cell(&reference.p99_us),
                opt_cell(reference.lock_ratio.as_ref()),
                cpu_cells(reference.cpu.as_ref())
            );
        }
        if let Some((u, place)) = &entry.uncontended {
            let _ = writeln!(
                md,
                "| `{backend}` | {library} | {} | {} | {} | {} | {} | {place} |",
                cell(&u.pairs_per_sec),
                cell(&u.p50_us),
                cell(&u.p99_us),
                opt_cell(u.ratio_to_floor.as_ref()),
                cpu_cells(u.cpu.as_ref())
            );
        }
    }
    md.push('\n');
}

fn many_table(md: &mut String, entries: &Entries, chart: Option<String>) {
    let with_many: Vec<_> = entries
        .iter()
        .filter_map(|((backend, (_, library)), e)| Some((backend, library, e.many.as_ref()?)))
        .collect();
    let Some((_, _, first)) = with_many.first() else {
        return;
    };
    let _ = writeln!(
        md,
        "## Many distinct locks, concurrent tasks of one process (pairs/s, all tasks together)\n"
    );
    let mut header = "| store | client |".to_owned();
    let mut rule = "|---|---|".to_owned();
    for point in &first.points {
        let _ = write!(header, " {} tasks |", point.tasks);
        rule.push_str("---:|");
    }
    let _ = writeln!(md, "{header}\n{rule}");
    for (backend, library, many) in &with_many {
        // dlock's row, with the floor before it and the ratio and server times after it where
        // they were measured (Redis).
        type Cells = fn(&ManyPoint) -> Option<&Spread>;
        let rows: [(String, Cells); 5] = [
            (
                "floor: redis-rs SET NX PX + DEL, the tasks on one multiplexed connection".into(),
                |p| p.floor_pairs_per_sec.as_ref(),
            ),
            (library.to_string(), |p| Some(&p.pairs_per_sec)),
            (format!("{library} / floor (run by run)"), |p| {
                p.ratio_to_floor.as_ref()
            }),
            (
                format!("{library}: Redis server µs per pair (`INFO commandstats`)"),
                |p| p.server_us_per_pair.as_ref(),
            ),
            (
                "floor: Redis server µs per pair (`INFO commandstats`)".into(),
                |p| p.floor_server_us_per_pair.as_ref(),
            ),
        ];
        for (what, cells) in rows {
            if many.points.iter().any(|p| cells(p).is_some()) {
                let cells: Vec<String> = many.points.iter().map(|p| opt_cell(cells(p))).collect();
                let _ = writeln!(md, "| `{backend}` | {what} | {} |", cells.join(" | "));
            }
        }
    }
    if let Some(chart) = chart {
        let _ = writeln!(md, "\n![throughput against concurrent tasks]({chart})");
    }
    md.push('\n');
}

fn handoff_table(md: &mut String, entries: &Entries, chart: Option<String>) {
    let mut rows = entries
        .iter()
        .filter_map(|((backend, (_, library)), e)| Some((backend, library, e.handoff.as_ref()?)))
        .peekable();
    let Some((_, _, (first, _))) = rows.peek() else {
        return;
    };
    let _ = writeln!(
        md,
        "## Contended hand-off ({} worker processes, each holding {} ms with a busy loop)\n\n\
         A hand-off is an acquisition by a different worker than the previous holder; its gap is\n\
         that holder's release to this acquisition, on the machine's clock. A re-take (the\n\
         releasing worker taking the lock straight back) is fast and is no hand-off: the re-take\n\
         column is its share of acquisitions, and the last gap column counts every gap, re-takes\n\
         too. Commands per acquisition are what every client sent the Redis server\n\
         (`INFO commandstats`).\n\n\
         | store | client | acquisitions/s | hand-offs/s | hand-off gap p50 µs | hand-off gap p99 µs | re-takes | every gap p99 µs | Jain | worst wait ms | commands/acq. | placement |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        first.processes,
        num(first.hold_ms)
    );
    for (backend, library, (h, place)) in rows {
        let gaps = h.holder_gaps.as_ref();
        let _ = writeln!(
            md,
            "| `{backend}` | {library} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {place} |",
            cell(&h.acquisitions_per_sec),
            cell(&h.handoffs_per_sec),
            opt_cell(gaps.map(|g| &g.p50_us)),
            opt_cell(gaps.map(|g| &g.p99_us)),
            opt_cell(gaps.and_then(|g| g.retake_share.as_ref())),
            cell(&h.gap_p99_us),
            cell(&h.fairness),
            cell(&h.worst_wait_ms),
            opt_cell(h.store_commands_per_acquisition.as_ref()),
        );
    }
    if let Some(chart) = chart {
        let _ = writeln!(md, "\n![hand-off gap distribution per library]({chart})");
    }
    md.push('\n');
}

fn watchdog_table(md: &mut String, entries: &Entries) {
    let rows: Vec<_> = entries
        .iter()
        .filter_map(|((backend, _), e)| Some((backend, e.watchdog.as_ref()?)))
        .collect();
    let Some((_, first)) = rows.first() else {
        return;
    };
    let _ = writeln!(
        md,
        "## Watchdog scale (one process holds many locks, lease {} ms, renewed every third of it)\n\n\
         | store | locks held | renewals/s | CPU, % of one core | RSS MiB | RSS growth MiB | lost | `dlock serve` `/metrics` ms | `/metrics` MB | `/api/locks` ms | serve RSS MiB |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        num(first.lease_ms)
    );
    for (backend, w) in rows {
        let _ = writeln!(
            md,
            "| `{backend}` | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            num(f64::from(w.held)),
            cell(&w.renewals_per_sec),
            cell(&w.cpu_percent),
            opt_cell(w.rss_mib.as_ref()),
            cell(&w.rss_growth_mib),
            w.lost,
            opt_cell(w.serve.as_ref().map(|s| &s.metrics_ms)),
            w.serve
                .as_ref()
                .map_or("–".to_owned(), |s| num(s.metrics_bytes as f64 / 1e6)),
            opt_cell(w.serve.as_ref().map(|s| &s.api_ms)),
            w.serve.as_ref().map_or("–".to_owned(), |s| num(s.rss_mib)),
        );
    }
    md.push('\n');
}

/// Draws the charts; returns their paths by name.
fn draw_charts(entries: &Entries, dir: &Path) -> anyhow::Result<BTreeMap<&'static str, PathBuf>> {
    let mut drawn = BTreeMap::new();
    let gap_series: Vec<Series> = entries
        .iter()
        .filter_map(|((backend, (_, library)), e)| {
            let (h, _) = e.handoff.as_ref()?;
            (h.gap_quantiles_us.len() == QUANTILES.len()).then(|| Series {
                label: format!("{library} ({backend})"),
                // A gap of 0 µs would not fit a log axis; 1 µs is below any real one.
                points: h
                    .gap_quantiles_us
                    .iter()
                    .zip(QUANTILES)
                    .map(|(&us, &q)| (us.max(1.0), q))
                    .collect(),
            })
        })
        .collect();
    if !gap_series.is_empty() {
        let path = dir.join("handoff-gap.svg");
        charts::lines(
            &path,
            "Hand-off gap, release to next acquisition (cumulative)",
            ("gap, µs (log)", "fraction of hand-offs"),
            false,
            &gap_series,
        )?;
        drawn.insert("handoff", path);
    }
    let throughput: Vec<Series> = entries
        .iter()
        .filter_map(|((backend, (_, library)), e)| {
            let many = e.many.as_ref()?;
            Some(Series {
                label: format!("{library} ({backend})"),
                points: many
                    .points
                    .iter()
                    .map(|p| (f64::from(p.tasks), p.pairs_per_sec.median))
                    .collect(),
            })
        })
        .collect();
    if !throughput.is_empty() {
        let path = dir.join("throughput-vs-tasks.svg");
        charts::lines(
            &path,
            "Acquire + release pairs/s against concurrent tasks (distinct names)",
            ("concurrent tasks (log)", "pairs/s (log)"),
            true,
            &throughput,
        )?;
        drawn.insert("throughput", path);
    }
    Ok(drawn)
}

/// dlock's Python package against redis-py on the same Redis server, in the same rounds.
fn python_section(md: &mut String, entries: &Entries, per_round: &PerRound) {
    let modes: Vec<&str> = ["sync", "asyncio"]
        .into_iter()
        .filter(|mode| find(entries, "redis", &python_label(mode)).is_some())
        .collect();
    if modes.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Python: dlock against redis-py (`redis`, same server, same rounds)\n\n\
         dlock's Python package (`pip install ./python`, a release build) through its redis-py\n\
         API (`locks.lock(name, timeout=30)`, `acquire()`, `release()`) and redis-py's own\n\
         `Lock` (`r.lock(name, timeout=30, sleep=…)`), sync and `asyncio`, as peers of the\n\
         bench (`scripts/peers/dlock_py.py`, `scripts/peers/redis_py.py`). Every round runs\n\
         each of them once on the same server, so the ratios are taken round by round and read\n\
         **median** (min – max) over the rounds.\n\n\
         ### Uncontended acquire + release (one thread or task, one name)\n\n\
         | mode | dlock (Python) pairs/s | redis-py pairs/s, sleep=0.1 | redis-py pairs/s, sleep=0.001 | dlock / faster redis-py, per round |\n\
         |---|---:|---:|---:|---:|"
    );
    let pairs = |library: &str| {
        find(entries, "redis", library)
            .and_then(|e| e.uncontended.as_ref())
            .map(|(u, _)| u.pairs_per_sec.clone())
    };
    for mode in &modes {
        let ratio = python_pairs_ratio(per_round, mode);
        let _ = writeln!(
            md,
            "| {mode} | {} | {} | {} | {} |",
            opt_cell(pairs(&python_label(mode)).as_ref()),
            opt_cell(pairs(&redis_py_label(mode, "0.1")).as_ref()),
            opt_cell(pairs(&redis_py_label(mode, "0.001")).as_ref()),
            ratio.as_ref().map_or_else(|| "–".to_owned(), ratio_cell),
        );
    }
    let processes_hold = find(entries, "redis", &python_label(modes[0]))
        .and_then(|e| e.handoff.as_ref())
        .map(|(h, _)| (h.processes, h.hold_ms));
    let Some((processes, hold_ms)) = processes_hold else {
        md.push('\n');
        return;
    };
    let _ = writeln!(
        md,
        "\n### Hand-off ({processes} processes, one name, each holding {} ms with a busy loop)\n\n\
         The hand-off gap is one holder's release to the next holder's acquisition, counted only\n\
         when the lock changes hands (a polling worker that takes the lock straight back is not a\n\
         hand-off); hand-offs/s count those changes.\n\n\
         | client | hand-offs/s | hand-off gap p50 µs | p99 µs | max µs | acquisitions/s | Jain | commands/acq. |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|",
        num(hold_ms)
    );
    for mode in &modes {
        let mut libraries = vec![python_label(mode)];
        libraries.extend(
            REDIS_PY_SLEEPS
                .iter()
                .map(|sleep| redis_py_label(mode, sleep)),
        );
        for library in libraries {
            let Some((h, _)) = find(entries, "redis", &library).and_then(|e| e.handoff.as_ref())
            else {
                continue;
            };
            let gaps = h.holder_gaps.as_ref();
            let _ = writeln!(
                md,
                "| {library} | {} | {} | {} | {} | {} | {} | {} |",
                cell(&h.handoffs_per_sec),
                opt_cell(gaps.map(|g| &g.p50_us)),
                opt_cell(gaps.map(|g| &g.p99_us)),
                opt_cell(gaps.map(|g| &g.max_us)),
                cell(&h.acquisitions_per_sec),
                cell(&h.fairness),
                opt_cell(h.store_commands_per_acquisition.as_ref()),
            );
        }
    }
    let _ = writeln!(
        md,
        "\n| mode | redis-py p99 / dlock p99, sleep=0.1 (default), per round | same, sleep=0.001 |\n\
         |---|---:|---:|"
    );
    for mode in &modes {
        let cell_of = |sleep| {
            python_gap_ratio(per_round, mode, sleep)
                .as_ref()
                .map_or_else(|| "–".to_owned(), ratio_cell)
        };
        let _ = writeln!(md, "| {mode} | {} | {} |", cell_of("0.1"), cell_of("0.001"));
    }
    md.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(backend: &str, library: &str, started_unix_s: u64, load: f64) -> Report {
        Report {
            library: library.to_owned(),
            backend: backend.to_owned(),
            environment: crate::results::Environment {
                started_unix_s,
                load_start: load,
                load_end: load,
                ..Default::default()
            },
            uncontended: None,
            handoff: None,
            floor: None,
            references: Vec::new(),
            many: None,
            watchdog: None,
        }
    }

    #[test]
    fn rounds_come_from_file_names() {
        assert_eq!(
            round_of(Path::new("r/dlock-py-sync-handoff.r3.json")),
            Some(3)
        );
        assert_eq!(round_of(Path::new("r/redis.r12.json")), Some(12));
        assert_eq!(round_of(Path::new("r/redis.json")), None);
    }

    /// Each round's ratio pairs that round's figures, never one round's with another's.
    #[test]
    fn ratios_are_taken_round_by_round() {
        let mut per_round = PerRound::new();
        let mut put = |library: &str, round: u32, pairs: f64| {
            per_round
                .entry(("redis".to_owned(), library.to_owned()))
                .or_default()
                .insert(
                    round,
                    RoundFigures {
                        pairs_per_sec: Some(pairs),
                        holder_gap_p99_us: Some(1e6 / pairs),
                        handoffs_per_sec: None,
                    },
                );
        };
        // dlock's figures fall by half in round 2 (a busy machine), redis-py's too.
        put("dlock (Python) sync", 1, 6000.0);
        put("dlock (Python) sync", 2, 3000.0);
        put("redis-py sync, sleep=0.1", 1, 3000.0);
        put("redis-py sync, sleep=0.001", 1, 2000.0);
        put("redis-py sync, sleep=0.1", 2, 1000.0);
        put("redis-py sync, sleep=0.001", 2, 1500.0);
        // A round without dlock gives no ratio.
        put("redis-py sync, sleep=0.1", 3, 9000.0);
        // Against the faster redis-py variant of each round: 6000/3000, 3000/1500.
        let pairs = python_pairs_ratio(&per_round, "sync").unwrap();
        assert_eq!((pairs.min, pairs.median, pairs.max), (2.0, 2.0, 2.0));
        // Gap p99 of redis-py (sleep=0.1) over dlock's: (1e6/3000)/(1e6/6000), (1e6/1000)/(1e6/3000).
        let gap = python_gap_ratio(&per_round, "sync", "0.1").unwrap();
        assert!(
            (gap.min - 2.0).abs() < 1e-9 && (gap.max - 3.0).abs() < 1e-9,
            "{gap:?}"
        );
        assert!(python_pairs_ratio(&per_round, "asyncio").is_none());
    }

    /// Reports hours apart are two runs, each with its own stores, rounds and load.
    #[test]
    fn reports_far_apart_are_separate_runs() {
        let reports = vec![
            (report("zk", "dlock", 1_000, 1.5), Some(1)),
            (report("redis", "dlock", 2_000_000, 0.5), Some(1)),
            (report("zk", "dlock", 1_300, 2.5), Some(3)),
            (
                report("redis", "redis-py sync, sleep=0.1", 2_000_100, 0.7),
                Some(5),
            ),
        ];
        let runs = runs(&reports);
        assert_eq!(runs.len(), 2);
        assert_eq!(
            (runs[0].first, runs[0].last, runs[0].rounds),
            (1_000, 1_300, 3)
        );
        assert_eq!((runs[0].load_min, runs[0].load_max), (1.5, 2.5));
        assert_eq!(runs[0].backends.iter().collect::<Vec<_>>(), ["zk"]);
        assert_eq!((runs[1].rounds, runs[1].load_max), (5, 0.7));
        assert_eq!(runs[1].backends.iter().collect::<Vec<_>>(), ["redis"]);
    }
}
