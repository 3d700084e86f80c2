//! `dlock elect NAME [--value V] -- CMD ARGS...`: campaign, run the command while leader, stop
//! its process group if leadership is lost; `dlock leader NAME [--watch] [--json]`: who leads.

use std::ffi::OsString;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use futures::StreamExt;
use serde_json::json;

use crate::run::{OnLost, Supervised, supervise};
use crate::shown::shown;
use crate::signals::{self, Signals};
use crate::take::{Held, report_failure};
use crate::{connect, exit, fail, parse_duration};

#[derive(Debug, Args)]
pub(crate) struct ElectArgs {
    /// The election's name.
    name: String,

    /// The value to publish as leader (an address, an id), shown by `dlock leader`.
    #[arg(long, default_value = "")]
    value: String,

    /// Lease of the term, renewed while dlock runs (default 30s). If dlock is killed, the
    /// next elector takes over within this.
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    ttl: Option<Duration>,

    /// Give up after this long waiting to lead; default: wait until elected.
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    wait: Option<Duration>,

    /// What to do to the command if leadership is lost while it runs (also sent if dlock dies).
    #[arg(long, value_enum, default_value_t = OnLost::Term)]
    on_lost: OnLost,

    /// After the --on-lost signal, SIGKILL the command if it still runs this much later.
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true, default_value = "10s")]
    kill_after: Duration,

    /// The command to run while leader (after `--`); it gets DLOCK_TERM (also DLOCK_FENCE),
    /// DLOCK_NAME and DLOCK_VALUE in its environment.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub(crate) struct LeaderArgs {
    /// The election's name.
    name: String,

    /// Keep following: print each change of leader, term or value until interrupted.
    #[arg(long)]
    watch: bool,

    /// JSON (one object per line with --watch; `null` when nobody leads).
    #[arg(long)]
    json: bool,
}

pub(crate) async fn elect(url: &str, label: Option<String>, args: ElectArgs) -> i32 {
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => return fail(&e.into()),
    };
    let mut locks = match connect(url, label).await {
        Ok(locks) => locks,
        Err(code) => return code,
    };
    if let Some(ttl) = args.ttl {
        match locks.with_watchdog_lease(ttl) {
            Ok(with) => locks = with,
            Err(e) => return fail(&e.into()),
        }
    }
    let mut election = locks.election(&args.name);
    if let Some(wait) = args.wait {
        election = election.wait(wait);
    }
    let leading = tokio::select! {
        elected = election.campaign(args.value.as_bytes()) => match elected {
            Ok(leading) => leading,
            Err(error) => return report_failure(&args.name, error),
        },
        sig = signals.recv() => {
            eprintln!("dlock: {sig} while campaigning in {}; the command was not run", shown(&args.name));
            return signals::exit_code(sig);
        }
    };
    let what = Supervised {
        name: &args.name,
        on_lost: args.on_lost,
        kill_after: args.kill_after,
        command: &args.command,
        envs: vec![
            ("DLOCK_TERM", leading.term().to_string()),
            ("DLOCK_VALUE", args.value.clone()),
        ],
        lost_exit: exit::LOST,
    };
    supervise(Held::Leader(leading), what, signals).await
}

/// The leader as `dlock leader --json` prints it: `ttl_left` in seconds (`null` for a
/// session), the `_ms` fields as `dlock inspect --json` has them.
fn to_json(name: &str, leader: Option<&dlock::Leader>) -> serde_json::Value {
    let Some(leader) = leader else {
        return serde_json::Value::Null;
    };
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    json!({
        "name": name,
        "value": String::from_utf8_lossy(&leader.value),
        "term": leader.term.get(),
        "owner": leader.owner.to_string(),
        "label": leader.owner.label,
        "host": leader.owner.host,
        "pid": leader.owner.pid,
        "since": humantime::format_rfc3339_millis(leader.since).to_string(),
        "since_ms": leader.since.duration_since(UNIX_EPOCH).map(millis).unwrap_or(0),
        "ttl_left": leader.ttl_left.map(|t| t.as_secs_f64()),
        "ttl_left_ms": leader.ttl_left.map(millis),
    })
}

fn to_text(name: &str, leader: Option<&dlock::Leader>) -> String {
    let Some(leader) = leader else {
        return format!("{}: no leader", shown(name));
    };
    let held = SystemTime::now()
        .duration_since(leader.since)
        .unwrap_or_default();
    let ttl = leader.ttl_left.map_or_else(
        || "session".to_owned(),
        |t| humantime::format_duration(Duration::from_millis(t.as_millis() as u64)).to_string(),
    );
    format!(
        "{}: term {} value {} owner {} for {} (lease {ttl} left)",
        shown(name),
        leader.term,
        shown(&String::from_utf8_lossy(&leader.value)),
        shown(&leader.owner.to_string()),
        humantime::format_duration(Duration::from_secs(held.as_secs())),
    )
}

/// Prints the leader; false when stdout is closed (`dlock leader --watch | head -1`).
fn show(args: &LeaderArgs, leader: Option<&dlock::Leader>) -> bool {
    let line = if args.json {
        to_json(&args.name, leader).to_string()
    } else {
        to_text(&args.name, leader)
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}

pub(crate) async fn leader(url: &str, args: LeaderArgs) -> i32 {
    let locks = match connect(url, None).await {
        Ok(locks) => locks,
        Err(code) => return code,
    };
    let election = locks.election(&args.name);
    if !args.watch {
        return match election.leader().await {
            Ok(leader) => {
                show(&args, leader.as_ref());
                if leader.is_some() { 0 } else { exit::NOT_HELD }
            }
            Err(e) => fail(&e.into()),
        };
    }
    let mut changes = election.observe();
    while let Some(change) = changes.next().await {
        match change {
            Ok(leader) => {
                if !show(&args, leader.as_ref()) {
                    return 0;
                }
            }
            Err(e @ (dlock::Error::Unsupported { .. } | dlock::Error::InvalidName { .. })) => {
                return fail(&e.into());
            }
            Err(e) => eprintln!("dlock: {e}"),
        }
    }
    0
}
