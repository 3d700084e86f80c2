//! `dlock bench --report DIR`: BENCHMARKS.md and its charts from the JSON reports of a run.
//!
//! Layout: `DIR/*.json` are the reports, `DIR/../charts/` receives the charts, and
//! `DIR/../notes.md` (hand-written: what the numbers mean, how they got there) is appended.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::charts::{self, Series};
use crate::results::{Floor, Handoff, ManyLocks, Report, Uncontended, WatchdogScale};
use crate::stats::{QUANTILES, Spread};

/// The measurements of one library on one store, merged from every report about it.
#[derive(Default)]
struct Entry {
    uncontended: Option<(Uncontended, String)>,
    floor: Option<Floor>,
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
                },
                self.uncontended_place.clone(),
            )
        });
        let floor = self.floor.first().map(|first| Floor {
            what: first.what.clone(),
            pairs_per_sec: merge_spreads(self.floor.iter().map(|f| &f.pairs_per_sec)),
            p50_us: merge_spreads(self.floor.iter().map(|f| &f.p50_us)),
            p99_us: merge_spreads(self.floor.iter().map(|f| &f.p99_us)),
        });
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
                lost: w.iter().map(|w| w.lost).sum(),
            }
        });
        Entry {
            uncontended,
            floor,
            many,
            handoff,
            watchdog,
        }
    }
}

/// (backend, library) → what was measured; dlock first within a backend.
type Entries = BTreeMap<(String, (bool, String)), Entry>;

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

/// Reads every report in `results`, writes `out` and the charts.
pub(crate) fn write(results: &Path, out: &Path) -> anyhow::Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(results)
        .with_context(|| format!("read {}", results.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    let mut reports = Vec::new();
    for file in &files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
        let report: Report =
            serde_json::from_str(&text).with_context(|| format!("parse {}", file.display()))?;
        reports.push(report);
    }
    anyhow::ensure!(
        !reports.is_empty(),
        "no JSON reports in {}",
        results.display()
    );
    let mut rounds: BTreeMap<_, Rounds> = BTreeMap::new();
    let (mut load_min, mut load_max) = (f64::MAX, f64::MIN);
    let (mut first, mut last) = (u64::MAX, 0);
    let mut cpus = 0;
    for report in reports {
        for load in [report.environment.load_start, report.environment.load_end] {
            if load.is_finite() {
                load_min = load_min.min(load);
                load_max = load_max.max(load);
            }
        }
        cpus = cpus.max(report.environment.cpus);
        first = first.min(report.environment.started_unix_s);
        last = last.max(report.environment.started_unix_s);
        let place = placement(&report);
        let entry = rounds.entry(key(&report)).or_default();
        if let Some(u) = report.uncontended {
            entry.uncontended.push(u);
            entry.uncontended_place = place.clone();
        }
        entry.floor.extend(report.floor);
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
    let _ = writeln!(
        md,
        "# Benchmarks\n\n\
         Generated by `dlock bench --report {}` from the JSON reports of one run of\n\
         `scripts/bench.sh` ({} to {}); do not edit by hand: edit `{}` or rerun.\n\n\
         The script runs every library and scenario once per round, all of them in turn, for\n\
         several rounds (3 by default), so that a change in the machine's load falls on all of\n\
         them alike; cells read **median** (min – max) over the rounds. Servers come from the\n\
         test kit (child processes on loopback); the peers were installed from their registries\n\
         by the script and ran on the same server instances as dlock. 1-minute load average\n\
         during the run: {:.2} – {:.2} (the machine has {} CPUs).\n",
        relative(results),
        date(first),
        date(last),
        relative(&base.join("notes.md")),
        load_min,
        load_max,
        cpus,
    );
    targets(&mut md, &entries);
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

fn targets(md: &mut String, entries: &Entries) {
    let _ = writeln!(
        md,
        "## Targets\n\n| target | measured (median, min – max) | verdict |\n|---|---|---|"
    );
    let mut row = |target: &str, measured: String, met: Option<bool>| {
        let _ = writeln!(md, "| {target} | {measured} | {} |", verdict(met));
    };
    for backend in ["redis", "sqlite"] {
        let ratio = find(entries, backend, "dlock")
            .and_then(|e| e.uncontended.as_ref())
            .and_then(|(u, _)| u.ratio_to_floor.clone());
        row(
            &format!("uncontended ≥ 0.85 of the floor (`{backend}`)"),
            opt_cell(ratio.as_ref()),
            ratio.map(|r| r.median >= 0.85),
        );
    }
    let dlock_redis = find(entries, "redis", "dlock").and_then(|e| e.uncontended.as_ref());
    let best_redis_py = peers(entries, "redis", "redis-py")
        .filter_map(|(lib, e)| e.uncontended.as_ref().map(|(u, _)| (lib, u)))
        .max_by(|a, b| {
            a.1.pairs_per_sec
                .median
                .total_cmp(&b.1.pairs_per_sec.median)
        });
    match (dlock_redis, best_redis_py) {
        (Some((d, _)), Some((lib, py))) => row(
            "uncontended ≥ 2x redis-py (its fastest variant, pairs/s)",
            format!(
                "{}x ({} against {lib}'s {} pairs/s; at the p50 latency {}x)",
                num(d.pairs_per_sec.median / py.pairs_per_sec.median),
                num(d.pairs_per_sec.median),
                num(py.pairs_per_sec.median),
                num(py.p50_us.median / d.p50_us.median),
            ),
            Some(d.pairs_per_sec.median / py.pairs_per_sec.median >= 2.0),
        ),
        _ => row("uncontended ≥ 2x redis-py", "–".to_owned(), None),
    }
    let handoff = find(entries, "redis", "dlock").and_then(|e| e.handoff.as_ref());
    match handoff {
        Some((h, _)) => {
            row(
                &format!(
                    "hand-off gap p99 ≤ 1 ms, {} processes × {} ms holds (Redis), µs",
                    h.processes,
                    num(h.hold_ms)
                ),
                cell(&h.gap_p99_us),
                Some(h.gap_p99_us.median <= 1000.0),
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
        None => row("hand-off p99 ≤ 1 ms, Jain ≥ 0.99", "–".to_owned(), None),
    }
    let redlock = find(entries, "redlock", "dlock");
    match redlock.and_then(|e| Some((e.uncontended.as_ref()?, e.floor.as_ref()?))) {
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
    let zk_handoff = find(entries, "zk", "dlock").and_then(|e| e.handoff.as_ref());
    let kazoo_handoff = peers(entries, "zk", "kazoo").find_map(|(_, e)| e.handoff.as_ref());
    if let (Some((d, _)), Some((k, _))) = (zk_handoff, kazoo_handoff) {
        let ratio = d.acquisitions_per_sec.median / k.acquisitions_per_sec.median;
        row(
            "ZooKeeper ≥ 2x kazoo (hand-off acquisitions/s)",
            format!(
                "{}x ({} against {})",
                num(ratio),
                num(d.acquisitions_per_sec.median),
                num(k.acquisitions_per_sec.median)
            ),
            Some(ratio >= 2.0),
        );
    }
    for backend in ["redis", "memory", "sqlite"] {
        if let Some(w) = find(entries, backend, "dlock").and_then(|e| e.watchdog.as_ref()) {
            let rss = w.rss_mib.as_ref().unwrap_or(&w.rss_growth_mib);
            row(
                &format!(
                    "{} watched locks (`{backend}`): RSS < 64 MB",
                    num(f64::from(w.held))
                ),
                format!("{} MiB", cell(rss)),
                Some(rss.median * 1.048_576 < 64.0),
            );
            row(
                &format!(
                    "{} watched locks (`{backend}`): CPU < 5 % of a core",
                    num(f64::from(w.held))
                ),
                format!("{} %", cell(&w.cpu_percent)),
                Some(w.cpu_percent.median < 5.0),
            );
        }
    }
    md.push('\n');
}

fn uncontended_table(md: &mut String, entries: &Entries) {
    let _ = writeln!(
        md,
        "## Uncontended acquire + release (one task, one name)\n\n\
         The floor is the same client library doing plain store operations with no lock logic\n\
         (Redis: `SET NX PX` + `DEL`; SQLite: two write transactions; Redlock: the lock on one\n\
         of its nodes), measured in blocks alternating with the lock's.\n\n\
         | store | client | pairs/s | p50 µs | p99 µs | / floor | placement |\n|---|---|---:|---:|---:|---:|---|"
    );
    for ((backend, (_, library)), entry) in entries {
        if let Some(floor) = &entry.floor {
            let _ = writeln!(
                md,
                "| `{backend}` | floor: {} | {} | {} | {} | 1 | same |",
                floor.what,
                cell(&floor.pairs_per_sec),
                cell(&floor.p50_us),
                cell(&floor.p99_us)
            );
        }
        if let Some((u, place)) = &entry.uncontended {
            let _ = writeln!(
                md,
                "| `{backend}` | {library} | {} | {} | {} | {} | {place} |",
                cell(&u.pairs_per_sec),
                cell(&u.p50_us),
                cell(&u.p99_us),
                opt_cell(u.ratio_to_floor.as_ref())
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
        let cells: Vec<String> = many.points.iter().map(|p| cell(&p.pairs_per_sec)).collect();
        let _ = writeln!(md, "| `{backend}` | {library} | {} |", cells.join(" | "));
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
         The gap is one holder's release to the next holder's acquisition on the machine's clock;\n\
         hand-offs count only acquisitions by a different worker than the previous one; commands\n\
         per acquisition are what every client sent the Redis server (`INFO commandstats`).\n\n\
         | store | client | acquisitions/s | hand-offs/s | gap p50 µs | gap p99 µs | Jain | worst wait ms | commands/acq. | placement |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---|",
        first.processes,
        num(first.hold_ms)
    );
    for (backend, library, (h, place)) in rows {
        let _ = writeln!(
            md,
            "| `{backend}` | {library} | {} | {} | {} | {} | {} | {} | {} | {place} |",
            cell(&h.acquisitions_per_sec),
            cell(&h.handoffs_per_sec),
            cell(&h.gap_p50_us),
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
        "## Watchdog scale (one process holds {} locks, lease {} ms, renewed every third of it)\n\n\
         | store | renewals/s | CPU, % of one core | RSS MiB | RSS growth MiB | lost |\n|---|---:|---:|---:|---:|---:|",
        num(f64::from(first.held)),
        num(first.lease_ms)
    );
    for (backend, w) in rows {
        let _ = writeln!(
            md,
            "| `{backend}` | {} | {} | {} | {} | {} |",
            cell(&w.renewals_per_sec),
            cell(&w.cpu_percent),
            opt_cell(w.rss_mib.as_ref()),
            cell(&w.rss_growth_mib),
            w.lost
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
