//! PostgreSQL support for the real-server harness.
//!
//! `initdb` runs once per machine into a cached template (see `template.rs`); each server
//! copies it and runs `postgres` in the foreground on a loopback port with durability off.
//! As root, both run as the `postgres` system user (they refuse to run as root), through
//! `CommandExt::uid/gid` so the PID the harness holds is the postmaster's own.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::ServerKind;
use super::template;

const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// A throwaway PostgreSQL server: superuser `postgres` with `trust` authentication on
/// 127.0.0.1, `fsync` off, 500 connections allowed.
///
/// The binary is `postgres` on `PATH`, in `/usr/lib/postgresql/*/bin`, or the one named by
/// `DLOCK_TEST_POSTGRES_BIN`; `initdb` is taken from the same directory.
///
/// ```no_run
/// use dlock_testkit::server::{Postgres, ServerProcess};
///
/// let server = ServerProcess::start(Postgres::default())?;
/// let url = Postgres::url(&server);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Postgres {
    /// Extra command-line arguments, e.g. `["-c", "log_connections=on"]`.
    pub extra_args: Vec<String>,
}

impl Postgres {
    /// `postgres://postgres@127.0.0.1:PORT/postgres` for a server of this kind.
    pub fn url(server: &super::ServerProcess) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", server.port())
    }

    /// The user the server runs as: `postgres` when the tests run as root, else ourselves.
    fn ids() -> io::Result<Option<(u32, u32)>> {
        if template::current_uid() == 0 {
            template::user_ids("postgres").map(Some)
        } else {
            Ok(None)
        }
    }
}

fn as_user(cmd: &mut Command, ids: Option<(u32, u32)>) {
    if let Some((uid, gid)) = ids {
        cmd.uid(uid).gid(gid);
    }
}

impl ServerKind for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn binary(&self) -> &'static str {
        "postgres"
    }

    fn search_dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| {
                        let version = e.file_name().to_str()?.parse().ok()?;
                        Some((version, e.path().join("bin")))
                    })
                    .collect()
            })
            .unwrap_or_default();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.0));
        dirs.into_iter().map(|(_, dir)| dir).collect()
    }

    fn prepare(&self, bin: &Path, dir: &Path, _port: u16) -> io::Result<()> {
        let ids = Self::ids()?;
        let initdb = bin.with_file_name("initdb");
        let template = template::cached("postgres", bin, |building| {
            if let Some((uid, gid)) = ids {
                std::os::unix::fs::chown(building, Some(uid), Some(gid))?;
            }
            let mut cmd = Command::new(&initdb);
            cmd.arg("-D")
                .arg(building.join("data"))
                .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"])
                .args(["--no-sync", "--no-instructions"]);
            as_user(&mut cmd, ids);
            template::run(&mut cmd)
        })?;
        if let Some((uid, gid)) = ids {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
        }
        template::copy_data(&template, dir)
    }

    fn command(&self, bin: &Path, dir: &Path, port: u16) -> Command {
        let mut cmd = Command::new(bin);
        cmd.arg("-D")
            .arg(dir.join("data"))
            .arg("-k")
            .arg(dir)
            .args(["-p", &port.to_string(), "-h", "127.0.0.1"])
            // fsync off is safe for a process crash (the OS keeps the pages); commits still
            // write the WAL at once, so a killed server restarts with every committed row.
            .args(["-c", "fsync=off"])
            .args(["-c", "full_page_writes=off", "-c", "max_connections=500"])
            .args(["-c", "shared_buffers=32MB"])
            .args(&self.extra_args);
        // `prepare` already failed if the user is missing.
        as_user(&mut cmd, Self::ids().ok().flatten());
        cmd
    }

    fn probe(&self, addr: SocketAddr) -> io::Result<bool> {
        let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
        stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
        stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
        // StartupMessage, protocol 3.0: the answer is `R` (authentication: ready) or `E`
        // ("the database system is starting up").
        let mut body = Vec::new();
        body.extend_from_slice(&196_608_u32.to_be_bytes());
        for part in ["user", "postgres", "database", "postgres", ""] {
            body.extend_from_slice(part.as_bytes());
            body.push(0);
        }
        let len = u32::try_from(body.len() + 4).map_err(io::Error::other)?;
        let mut packet = len.to_be_bytes().to_vec();
        packet.extend_from_slice(&body);
        stream.write_all(&packet)?;
        let mut first = [0_u8; 1];
        stream.read_exact(&mut first)?;
        // Terminate politely so the log stays quiet.
        let _ = stream.write_all(&[b'X', 0, 0, 0, 4]);
        Ok(first[0] == b'R')
    }

    fn signals_descendants(&self) -> bool {
        true
    }

    fn stop_signal(&self) -> Option<libc::c_int> {
        Some(libc::SIGINT)
    }
}
