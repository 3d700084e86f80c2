//! Finding and driving the built `dlock` binary, the cross-process lock taker of the tests
//! (DistributedLock's "lock taker" idea: real processes, killed for real).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, bail};

/// The `dlock` binary: `DLOCK_TEST_CLI_BIN`, else next to the running test executable
/// (`target/<profile>/dlock`), which `cargo test --workspace` builds.
pub fn dlock_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("DLOCK_TEST_CLI_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("current_exe")?;
    // target/debug/deps/<test>-<hash> → target/debug/dlock
    for dir in exe.ancestors().skip(1).take(3) {
        let candidate = dir.join("dlock");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "the dlock binary was not found next to {}: run the tests with `cargo test --workspace` \
         (which builds it) or set DLOCK_TEST_CLI_BIN",
        exe.display()
    )
}

/// A `dlock` command with `--url` set.
pub fn dlock_command(url: &str) -> anyhow::Result<Command> {
    let mut cmd = Command::new(dlock_binary()?);
    cmd.arg("--url").arg(url);
    Ok(cmd)
}

/// A `dlock hold` process that has acquired its lock.
#[derive(Debug)]
pub struct Holder {
    /// The process.
    pub child: Child,
    /// The fence it printed.
    pub fence: u64,
    stdin: Option<ChildStdin>,
    _stdout: BufReader<ChildStdout>,
}

impl Holder {
    /// Runs `dlock --url URL hold NAME ARGS...` and waits until it prints `acquired <fence>`.
    pub fn start(url: &str, name: &str, args: &[&str]) -> anyhow::Result<Holder> {
        let mut child = dlock_command(url)?
            .arg("hold")
            .arg(name)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("spawn dlock hold")?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .context("read dlock hold output")?;
        let fence = line
            .trim()
            .strip_prefix("acquired ")
            .with_context(|| format!("dlock hold printed {line:?}"))?
            .parse()
            .context("fence")?;
        let stdin = child.stdin.take();
        Ok(Holder {
            child,
            fence,
            stdin,
            _stdout: stdout,
        })
    }

    /// SIGKILL: the holder dies without releasing.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Closes stdin: the holder releases and exits; returns its exit code.
    pub fn finish(mut self) -> anyhow::Result<i32> {
        drop(self.stdin.take());
        let status = self.child.wait()?;
        status.code().context("killed by a signal")
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
