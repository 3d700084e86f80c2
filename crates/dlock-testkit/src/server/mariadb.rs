//! MariaDB support for the real-server harness.
//!
//! `mariadb-install-db` runs once per machine into a cached template (see `template.rs`);
//! each server copies it and runs `mariadbd --no-defaults` on a loopback port.

use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::ServerKind;
use super::template;

const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// A throwaway MariaDB (or MySQL-compatible `mariadbd`) server: `root` with an empty
/// password from 127.0.0.1, binary log off, relaxed flushing, 1000 connections allowed.
///
/// The binary is `mariadbd` on `PATH` or in `/usr/sbin`, or the one named by
/// `DLOCK_TEST_MARIADB_BIN`; `mariadb-install-db` is looked up on `PATH`.
///
/// ```no_run
/// use dlock_testkit::server::{Mariadb, ServerProcess};
///
/// let server = ServerProcess::start(Mariadb::default())?;
/// let url = Mariadb::url(&server);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Mariadb {
    /// Extra command-line arguments, e.g. `["--wait-timeout=5"]`.
    pub extra_args: Vec<String>,
}

impl Mariadb {
    /// `mysql://root@127.0.0.1:PORT/mysql` for a server of this kind.
    pub fn url(server: &super::ServerProcess) -> String {
        format!("mysql://root@127.0.0.1:{}/mysql", server.port())
    }
}

fn install_db(bin: &Path) -> PathBuf {
    let beside = bin.with_file_name("mariadb-install-db");
    if beside.is_file() {
        return beside;
    }
    let in_bin = PathBuf::from("/usr/bin/mariadb-install-db");
    if in_bin.is_file() {
        return in_bin;
    }
    PathBuf::from("mariadb-install-db")
}

impl ServerKind for Mariadb {
    fn name(&self) -> &'static str {
        "mariadb"
    }

    fn binary(&self) -> &'static str {
        "mariadbd"
    }

    fn prepare(&self, bin: &Path, dir: &Path, _port: u16) -> io::Result<()> {
        let template = template::cached("mariadb", bin, |building| {
            let mut cmd = Command::new(install_db(bin));
            cmd.arg("--no-defaults")
                .arg(format!("--datadir={}", building.join("data").display()))
                .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
            if template::current_uid() == 0 {
                cmd.arg("--user=root");
            }
            template::run(&mut cmd)
        })?;
        template::copy_data(&template, dir)
    }

    fn command(&self, bin: &Path, dir: &Path, port: u16) -> Command {
        let mut cmd = Command::new(bin);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--pid-file={}", dir.join("mysqld.pid").display()))
            .arg(format!("--log-error={}", self.log_path(dir).display()))
            // Its temporary tables in its own folder, not the machine's /tmp: a parallel test
            // run once lost one there ("Error on delete of '/tmp/#sql-temptable-…'").
            .arg(format!("--tmpdir={}", dir.display()))
            .args([
                "--skip-log-bin",
                "--skip-name-resolve",
                "--max-connections=1000",
            ])
            .args([
                "--innodb-buffer-pool-size=64M",
                "--innodb-log-file-size=16M",
            ])
            .args(["--innodb-flush-log-at-trx-commit=2"])
            .args(&self.extra_args);
        if template::current_uid() == 0 {
            cmd.arg("--user=root");
        }
        cmd
    }

    fn probe(&self, addr: SocketAddr) -> io::Result<bool> {
        let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
        stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
        // The server speaks first: a packet header, then protocol version 10.
        let mut head = [0_u8; 5];
        stream.read_exact(&mut head)?;
        Ok(head[4] == 10)
    }

    fn log_path(&self, dir: &Path) -> PathBuf {
        dir.join("err.log")
    }
}
