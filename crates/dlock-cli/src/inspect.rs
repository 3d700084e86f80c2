//! `dlock ls`, `dlock inspect` and `dlock break`.

use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use futures::TryStreamExt;
use serde_json::json;

use crate::shown::shown;
use crate::{connect, exit, fail};

#[derive(Debug, Args)]
pub(crate) struct LsArgs {
    /// Only locks whose names start with this.
    #[arg(default_value = "")]
    prefix: String,

    /// One JSON array instead of a table.
    #[arg(long)]
    json: bool,

    /// Show the parts composed semaphores and read-write locks are made of (`NAME#p0of3`,
    /// `NAME#rwgate`, `NAME#r0`) instead of one entry per primitive.
    #[arg(long)]
    parts: bool,

    /// Keep listing: redraw the table in place every --interval until interrupted.
    #[arg(long, conflicts_with = "json")]
    watch: bool,

    /// How often --watch redraws.
    #[arg(long, default_value = "1s", value_parser = crate::parse_duration, requires = "watch")]
    interval: std::time::Duration,
}

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// The lock's name.
    name: String,

    /// JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct BreakArgs {
    /// The lock's name.
    name: String,

    /// Do not ask for confirmation.
    #[arg(long, short)]
    yes: bool,
}

fn held_for(info: &dlock::LockInfo) -> Duration {
    SystemTime::now()
        .duration_since(info.acquired_at)
        .unwrap_or_default()
}

fn short(d: Duration) -> String {
    // Whole milliseconds below a second, whole seconds above: a table, not a stopwatch.
    let d = if d < Duration::from_secs(1) {
        Duration::from_millis(d.as_millis().try_into().unwrap_or(0))
    } else {
        Duration::from_secs(d.as_secs())
    };
    humantime::format_duration(d).to_string()
}

pub(crate) fn to_json(info: &dlock::LockInfo) -> serde_json::Value {
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    json!({
        "name": info.name,
        "fence": info.fence.get(),
        "label": info.owner.label,
        "host": info.owner.host,
        "pid": info.owner.pid,
        "holds": info.holds,
        "acquired_at": humantime::format_rfc3339_millis(info.acquired_at).to_string(),
        "acquired_at_ms": info.acquired_at.duration_since(UNIX_EPOCH).map(millis).unwrap_or(0),
        "held_for_ms": millis(held_for(info)),
        "ttl_left_ms": info.ttl_left.map(millis),
        "kind": info.kind,
        "waiters": info.waiters,
    })
}

pub(crate) async fn ls(url: &str, args: LsArgs) -> i32 {
    let locks = match connect(url, None).await {
        Ok(locks) => locks,
        Err(code) => return code,
    };
    if args.watch {
        return watch(&locks, &args).await;
    }
    let held = match listed(&locks, &args.prefix, args.parts).await {
        Ok(held) => held,
        Err(e) => return fail(&e.into()),
    };
    if args.json {
        println!(
            "{}",
            serde_json::Value::Array(held.iter().map(to_json).collect())
        );
        return 0;
    }
    if held.is_empty() {
        if std::io::stdout().is_terminal() {
            eprintln!("{}", nothing_held(&args.prefix));
        }
        return 0;
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(table(&held).as_bytes());
    0
}

/// Held locks under `prefix`, sorted by name; composed primitives folded into one entry each
/// unless `parts`.
async fn listed(
    locks: &dlock::Locks,
    prefix: &str,
    parts: bool,
) -> dlock::Result<Vec<dlock::LockInfo>> {
    let mut held: Vec<dlock::LockInfo> = locks.list(prefix).try_collect().await?;
    if !parts {
        return Ok(crate::composed::fold(held));
    }
    held.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(held)
}

fn nothing_held(prefix: &str) -> String {
    if prefix.is_empty() {
        "no locks held".into()
    } else {
        format!("no locks held under \"{}\"", shown(prefix))
    }
}

/// `dlock ls --watch`: the table redrawn every interval, in place on a terminal (the screen
/// is cleared and the cursor sent home first), one table after another otherwise. A store
/// error is shown and the next round tries again.
async fn watch(locks: &dlock::Locks, args: &LsArgs) -> i32 {
    let terminal = std::io::stdout().is_terminal();
    let mut ticks = tokio::time::interval(args.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let body = match listed(locks, &args.prefix, args.parts).await {
            Ok(held) if held.is_empty() => format!("{}\n", nothing_held(&args.prefix)),
            Ok(held) => table(&held),
            Err(e) => format!("dlock: {}\n", shown(&e.to_string())),
        };
        let stamp = humantime::format_rfc3339_seconds(SystemTime::now());
        let frame = if terminal {
            format!(
                "\x1b[H\x1b[2J{stamp}  every {}\n\n{body}",
                short(args.interval)
            )
        } else {
            format!("{stamp}\n{body}\n")
        };
        let mut out = std::io::stdout().lock();
        if out
            .write_all(frame.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            return 0; // the reader went away (`dlock ls --watch | head`)
        }
    }
}

/// The table `dlock ls` prints, header first.
fn table(held: &[dlock::LockInfo]) -> String {
    let rows: Vec<[String; 9]> = held
        .iter()
        .map(|info| {
            [
                shown(&info.name).into_owned(),
                info.kind.to_string(),
                info.owner
                    .label
                    .as_deref()
                    .map_or_else(|| "-".into(), |l| shown(l).into_owned()),
                shown(&info.owner.host).into_owned(),
                info.owner.pid.to_string(),
                info.fence.to_string(),
                short(held_for(info)),
                info.ttl_left.map(short).unwrap_or_else(|| "session".into()),
                info.waiters.map_or_else(|| "-".into(), |w| w.to_string()),
            ]
        })
        .collect();
    let header = [
        "NAME", "KIND", "OWNER", "HOST", "PID", "FENCE", "HELD FOR", "TTL LEFT", "WAITERS",
    ];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        cells
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

pub(crate) async fn inspect(url: &str, args: InspectArgs) -> i32 {
    let locks = match connect(url, None).await {
        Ok(locks) => locks,
        Err(code) => return code,
    };
    match locks.inspect(&args.name).await {
        Ok(Some(info)) if args.json => {
            println!("{}", to_json(&info));
            0
        }
        Ok(Some(info)) => {
            println!("name:      {}", shown(&info.name));
            println!(
                "owner:     {}",
                shown(info.owner.label.as_deref().unwrap_or("-"))
            );
            println!("host:      {}", shown(&info.owner.host));
            println!("pid:       {}", info.owner.pid);
            println!("fence:     {}", info.fence);
            println!("holds:     {}", info.holds);
            println!(
                "acquired:  {} ({} ago)",
                humantime::format_rfc3339_seconds(info.acquired_at),
                short(held_for(&info))
            );
            println!(
                "ttl left:  {}",
                info.ttl_left.map(short).unwrap_or_else(|| "session".into())
            );
            0
        }
        Ok(None) if args.json => {
            println!("null");
            exit::NOT_HELD
        }
        Ok(None) => {
            println!("{}: free", shown(&args.name));
            exit::NOT_HELD
        }
        Err(e) => fail(&e.into()),
    }
}

pub(crate) async fn break_lock(url: &str, args: BreakArgs) -> i32 {
    let locks = match connect(url, None).await {
        Ok(locks) => locks,
        Err(code) => return code,
    };
    if !args.yes {
        if !std::io::stdin().is_terminal() {
            eprintln!(
                "dlock: refusing to break {} without --yes when stdin is not a terminal",
                shown(&args.name)
            );
            return exit::FAILED;
        }
        let holder = match locks.inspect(&args.name).await {
            Ok(Some(info)) => format!(
                "held by {} (fence {})",
                shown(&info.owner.to_string()),
                info.fence
            ),
            Ok(None) => {
                println!("{}: free", shown(&args.name));
                return exit::NOT_HELD;
            }
            Err(e) => return fail(&e.into()),
        };
        eprint!("break {} {holder}? [y/N] ", shown(&args.name));
        let mut answer = String::new();
        if std::io::stdin().lock().read_line(&mut answer).is_err()
            || !answer.trim().eq_ignore_ascii_case("y")
        {
            eprintln!("not broken");
            return exit::NOT_HELD;
        }
    }
    match locks.force_release(&args.name).await {
        Ok(true) => {
            println!("{}: broken", shown(&args.name));
            0
        }
        Ok(false) => {
            println!("{}: free", shown(&args.name));
            exit::NOT_HELD
        }
        Err(e) => fail(&e.into()),
    }
}
