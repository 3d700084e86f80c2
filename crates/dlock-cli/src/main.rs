//! `dlock`: run a command under a distributed lock, and list, inspect, break and benchmark locks.
#![doc = include_str!("../README.md")]

mod demo;
mod exit;
mod hold;
mod inspect;
mod job;
mod run;
mod shown;
mod signals;
mod take;

use std::time::Duration;

use clap::{Parser, Subcommand};

/// Distributed locks from the shell.
#[derive(Debug, Parser)]
#[command(name = "dlock", version, about, after_help = exit::HELP)]
struct Cli {
    /// Lock store URL: sqlite:///path/locks.db (the default: one file shared by the processes of
    /// this machine), memory:// (this process only), or any other URL dlock::connect accepts.
    // The URL may hold a password: `--help` must not print it from the environment.
    #[arg(long, env = "DLOCK_URL", hide_env_values = true, global = true, default_value_t = default_url())]
    url: String,

    /// Label stored with the locks this invocation takes, shown by `dlock ls`.
    #[arg(long, env = "DLOCK_LABEL", hide_env_values = true, global = true)]
    label: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Hold a lock while a command runs; the lock is renewed, the fence is passed in DLOCK_FENCE.
    Run(run::RunArgs),
    /// Take a lock, print `acquired <fence>`, and hold it until stdin closes or a signal.
    Hold(hold::HoldArgs),
    /// List held locks (name, owner, host, pid, fence, held for, TTL left).
    #[command(alias = "list")]
    Ls(inspect::LsArgs),
    /// Show who holds one lock.
    Inspect(inspect::InspectArgs),
    /// Break a lock whoever holds it (the holder's guard reports it lost).
    Break(inspect::BreakArgs),
    /// Measure the store: uncontended acquire+release and cross-process hand-off.
    Bench(dlock_bench::BenchArgs),
    /// Run a seed scenario (seckill, scheduler) over many processes and check its outcome.
    Demo(demo::DemoArgs),
    /// Internal: started by `dlock run` to stop its command's processes if dlock dies.
    #[command(name = "__guard", hide = true)]
    Guard(job::GuardArgs),
}

pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    if text.trim_start().starts_with('-') {
        return Err(format!(
            "{text:?} is negative: a duration is 0 or more (examples: 500ms, 10s, 5m)"
        ));
    }
    humantime::parse_duration(text).map_err(|e| format!("{e} (examples: 500ms, 10s, 5m)"))
}

/// The embedded default: a SQLite file in the user's state directory (the library's, so
/// programs and the command share one file).
fn default_url() -> String {
    dlock::default_url()
}

/// Reports an error from dlock itself and returns the matching exit code.
pub(crate) fn fail(error: &anyhow::Error) -> i32 {
    eprintln!("dlock: {}", shown::shown(&format!("{error:#}")));
    exit::FAILED
}

fn main() {
    let cli = Cli::parse();
    if let Command::Guard(args) = &cli.command {
        std::process::exit(job::guard(args));
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DLOCK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    // The benchmark measures a client's latency, so it runs on one thread (no cross-thread
    // wake-up per round trip), as a latency-sensitive application would; `--threads` changes it.
    let builder = match &cli.command {
        Command::Bench(args) if args.threads <= 1 => tokio::runtime::Builder::new_current_thread(),
        Command::Bench(args) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(args.threads);
            builder
        }
        _ => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(2);
            builder
        }
    };
    let runtime = match { builder }.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => std::process::exit(fail(&e.into())),
    };
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(&cli.url, cli.label, args).await,
            Command::Hold(args) => hold::hold(&cli.url, cli.label, args).await,
            Command::Ls(args) => inspect::ls(&cli.url, args).await,
            Command::Inspect(args) => inspect::inspect(&cli.url, args).await,
            Command::Break(args) => inspect::break_lock(&cli.url, args).await,
            Command::Demo(args) => demo::demo(&cli.url, args).await,
            Command::Guard(_) => exit::FAILED,
            Command::Bench(args) => match dlock_bench::run(&cli.url, args).await {
                Ok(()) => 0,
                Err(e) => fail(&e),
            },
        }
    });
    // Exit at once: a blocking stdin reader must not keep the process alive.
    std::process::exit(code);
}

/// Connects and applies the label; errors are reported and turned into an exit code.
pub(crate) async fn connect(url: &str, label: Option<String>) -> Result<dlock::Locks, i32> {
    let locks = dlock::connect(url).await.map_err(|e| fail(&e.into()))?;
    match label {
        Some(label) => locks.with_label(label).map_err(|e| fail(&e.into())),
        None => Ok(locks),
    }
}
