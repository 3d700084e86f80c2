//! `dlock`: run a command under a distributed lock, and list, inspect, break and benchmark locks.
#![doc = include_str!("../README.md")]

mod composed;
mod demo;
mod elect;
mod exit;
mod hold;
mod inspect;
mod job;
mod run;
mod serve;
mod shown;
mod signals;
mod take;

use std::io::Write;
use std::sync::LazyLock;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};

/// What `dlock --version` prints after the name: the version and the backends compiled in.
static VERSION: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{} (backends: {})",
        env!("CARGO_PKG_VERSION"),
        dlock::enabled_backends().join(", ")
    )
});

/// Distributed locks from the shell.
#[derive(Debug, Parser)]
#[command(name = "dlock", version = VERSION.as_str(), about, after_help = exit::HELP)]
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
    /// Campaign to lead NAME; while leader, run a command (stopped if leadership is lost).
    Elect(elect::ElectArgs),
    /// Show who leads the election NAME (its value, term, owner, lease left); --watch follows.
    Leader(elect::LeaderArgs),
    /// Take a lock, print `acquired <fence>`, and hold it until stdin closes or a signal.
    Hold(hold::HoldArgs),
    /// List held locks (name, kind, owner, host, pid, fence, held for, TTL left, waiters).
    #[command(alias = "list")]
    Ls(inspect::LsArgs),
    /// Show who holds one lock.
    Inspect(inspect::InspectArgs),
    /// Break a lock whoever holds it (the holder's guard reports it lost).
    Break(inspect::BreakArgs),
    /// Serve the store's held locks over HTTP: Prometheus /metrics, JSON /api/locks, a live page.
    Serve(serve::ServeArgs),
    /// Measure the store: uncontended acquire+release and cross-process hand-off.
    Bench(dlock_bench::BenchArgs),
    /// Run a seed scenario (seckill, scheduler) over many processes and check its outcome.
    Demo(demo::DemoArgs),
    /// Print shell completions for dlock (e.g. `dlock completions bash`).
    Completions(CompletionsArgs),
    /// Print dlock's man page (roff); with a command name, that command's page.
    Man(ManArgs),
    /// Internal: started by `dlock run` to stop its command's processes if dlock dies.
    #[command(name = "__guard", hide = true)]
    Guard(job::GuardArgs),
}

#[derive(Debug, clap::Args)]
struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Debug, clap::Args)]
struct ManArgs {
    /// A command (run, hold, ls, ...) whose own page to print, as `dlock-COMMAND(1)`.
    command: Option<String>,
}

/// The command line as users see it, for completions and the man page: the same definition
/// without the internal `__guard`, which neither may offer. A hidden subcommand cannot be
/// removed from a clap command, so the public one is rebuilt from the parts not hidden.
fn public_command() -> clap::Command {
    let full = Cli::command();
    let mut public = clap::Command::new("dlock")
        // The man page's header: the plain version (`--version` adds the backends).
        .version(env!("CARGO_PKG_VERSION"))
        .after_help(exit::HELP)
        .subcommand_required(true)
        .args(full.get_arguments().cloned())
        .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    if let Some(about) = full.get_about() {
        public = public.about(about.clone());
    }
    public
}

/// Writes generated text to stdout; a closed pipe (`dlock man | head`) is not an error.
fn print_generated(text: &[u8]) -> i32 {
    let mut out = std::io::stdout().lock();
    match out.write_all(text).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => fail(&e.into()),
    }
}

/// `dlock completions SHELL`: the script for that shell's completion system.
fn completions(args: &CompletionsArgs) -> i32 {
    // Into memory first: the generator cannot report a write error (it would panic on one).
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut public_command(), "dlock", &mut script);
    print_generated(&script)
}

/// `dlock man [COMMAND]`: the roff man page of dlock, or of one of its commands.
fn man(args: &ManArgs) -> i32 {
    let mut page = public_command();
    // Built, each command carries the global options and is named `dlock-run` (as git and
    // cargo name their commands' pages, `dlock-run(1)`), with `dlock run` in its synopsis.
    page.build();
    if let Some(name) = &args.command {
        let Some(sub) = page.find_subcommand(name).cloned() else {
            eprintln!(
                "dlock: no command {} (commands: {})",
                shown::shown(name),
                page.get_subcommands()
                    .map(|s| s.get_name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return exit::FAILED;
        };
        page = sub.version(env!("CARGO_PKG_VERSION"));
    }
    let mut roff = Vec::new();
    if let Err(e) = clap_mangen::Man::new(page).render(&mut roff) {
        return fail(&e.into());
    }
    print_generated(&roff)
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
    match &cli.command {
        Command::Guard(args) => std::process::exit(job::guard(args)),
        // Generated from the command definition: no store, no runtime.
        Command::Completions(args) => std::process::exit(completions(args)),
        Command::Man(args) => std::process::exit(man(args)),
        _ => {}
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
            Command::Elect(args) => elect::elect(&cli.url, cli.label, args).await,
            Command::Leader(args) => elect::leader(&cli.url, args).await,
            Command::Ls(args) => inspect::ls(&cli.url, args).await,
            Command::Inspect(args) => inspect::inspect(&cli.url, args).await,
            Command::Break(args) => inspect::break_lock(&cli.url, args).await,
            Command::Serve(args) => serve::serve(&cli.url, args).await,
            Command::Demo(args) => demo::demo(&cli.url, args).await,
            Command::Guard(_) | Command::Completions(_) | Command::Man(_) => exit::FAILED,
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
