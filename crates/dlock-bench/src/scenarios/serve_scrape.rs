//! `dlock serve` under load: started on the store while the watchdog scenario holds its locks,
//! then `/metrics` and `/api/locks` are fetched several times: time to answer, size, and the
//! serving process's memory.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::results::ServeScrape;
use crate::stats::Spread;
use crate::system::rss_mib_of;

/// A `dlock serve` child process, killed on drop.
struct Served {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `dlock` binary this bench runs in, if it is one (`dlock bench`); a test binary is not.
fn dlock_binary() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    (exe.file_name()? == "dlock").then_some(exe)
}

fn start(binary: &std::path::Path, url: &str) -> anyhow::Result<Served> {
    let mut child = Command::new(binary)
        // Every fetch a listing of its own: what is measured is one store scan, not the cache
        // that shares one listing among the requests of an interval.
        .args([
            "--url",
            url,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--list-interval",
            "0s",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("start dlock serve")?;
    let mut line = String::new();
    let stdout = child.stdout.take().context("dlock serve's stdout")?;
    BufReader::new(stdout).read_line(&mut line)?;
    let addr = line
        .strip_prefix("serving http://")
        .and_then(|rest| rest.split('/').next())
        .and_then(|addr| addr.parse().ok());
    match addr {
        Some(addr) => Ok(Served { child, addr }),
        None => {
            let _ = child.kill();
            bail!("dlock serve did not say where it listens: {line:?}")
        }
    }
}

/// One `GET path`: the body's length and the time to the last byte.
fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(Vec<u8>, Duration)> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply)?;
    let took = started.elapsed();
    let head_end = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no HTTP head")?;
    let head = String::from_utf8_lossy(&reply[..head_end]);
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok((reply[head_end + 4..].to_vec(), took))
}

/// Serves `url` and fetches `/metrics` and `/api/locks` `rounds` times each; `None` when this
/// process is not the `dlock` binary (nothing to start `serve` from).
pub(crate) fn scrape(url: &str, rounds: u32) -> anyhow::Result<Option<ServeScrape>> {
    let Some(binary) = dlock_binary() else {
        return Ok(None);
    };
    let served = start(&binary, url)?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (mut metrics_ms, mut api_ms) = (Vec::new(), Vec::new());
    let (mut metrics_bytes, mut api_bytes, mut listed) = (0, 0, 0);
    for _ in 0..rounds.max(1) {
        let (body, took) = get(served.addr, "/metrics")?;
        metrics_ms.push(ms(took));
        metrics_bytes = body.len() as u64;
        let (body, took) = get(served.addr, "/api/locks")?;
        api_ms.push(ms(took));
        api_bytes = body.len() as u64;
        let locks: serde_json::Value = serde_json::from_slice(&body)?;
        listed = locks
            .get("locks")
            .and_then(serde_json::Value::as_array)
            .or_else(|| locks.as_array())
            .map_or(0, |l| l.len() as u64);
    }
    Ok(Some(ServeScrape {
        metrics_ms: Spread::of(metrics_ms),
        metrics_bytes,
        api_ms: Spread::of(api_ms),
        api_bytes,
        listed,
        rss_mib: rss_mib_of(&served.child.id().to_string()),
    }))
}
