#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! `dlock serve` end to end, on real stores: held locks and their waiters in `/metrics` and
//! `/api/locks`, the metrics read by Prometheus's own checker (`promtool`), the page loaded in
//! a real headless Chromium, breaking only with `--allow-break` and the token (a generated one
//! never printed), only requests naming this server in `Host`, and one store scan for a
//! burst of requests (counted by the store itself).
//!
//! A test whose server or tool (`redis`, `postgres`, `mariadb`, `etcd`, `zookeeper`,
//! `promtool`, `chromium`) is not on this machine is reported as ignored, with what it needs,
//! never as passed; when `DLOCK_TEST_REQUIRE` names it (`all`, or a list), it runs and fails.
//! So the file is its own harness (libtest-mimic), which decides that before the run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::fixture::{EtcdFixture, Fixture, SqlFixture, SqlServer, ZookeeperFixture};
use dlock_testkit::server::{
    Etcd, Mariadb, Postgres, Redis, ServerProcess, find_binary, required, zookeeper_installed,
};
use libtest_mimic::{Arguments, Failed, Trial};

const REDIS_PASSWORD: &str = "pw-secret-serve";

/// A test of this file: its name, what it needs from the machine, the test.
type Case = (&'static str, &'static [&'static str], fn());

/// Every test of this file.
const TESTS: &[Case] = &[
    (
        "sqlite_held_lock_and_waiter_appear_in_metrics_and_api",
        &["promtool"],
        sqlite_held_lock_and_waiter_appear_in_metrics_and_api,
    ),
    (
        "redis_held_lock_and_waiter_appear_in_metrics_and_api",
        &["redis", "promtool"],
        redis_held_lock_and_waiter_appear_in_metrics_and_api,
    ),
    (
        "postgres_held_lock_and_waiter_appear_in_metrics_and_api",
        &["postgres", "promtool"],
        postgres_held_lock_and_waiter_appear_in_metrics_and_api,
    ),
    (
        "mariadb_held_lock_and_waiter_appear_in_metrics_and_api",
        &["mariadb", "promtool"],
        mariadb_held_lock_and_waiter_appear_in_metrics_and_api,
    ),
    (
        "etcd_held_lock_and_waiter_appear_in_metrics_and_api",
        &["etcd", "promtool"],
        etcd_held_lock_and_waiter_appear_in_metrics_and_api,
    ),
    (
        "zookeeper_held_lock_and_waiter_appear_in_metrics_and_api",
        &["zookeeper", "promtool"],
        zookeeper_held_lock_and_waiter_appear_in_metrics_and_api,
    ),
    (
        "redlock_held_lock_appears_in_metrics_and_api_without_a_waiter_count",
        &["redis", "promtool"],
        redlock_held_lock_appears_in_metrics_and_api_without_a_waiter_count,
    ),
    (
        "the_store_password_is_never_served",
        &["redis"],
        the_store_password_is_never_served,
    ),
    (
        "breaking_needs_allow_break_and_the_token",
        &[],
        breaking_needs_allow_break_and_the_token,
    ),
    (
        "bad_serve_arguments_are_refused_without_a_panic",
        &[],
        bad_serve_arguments_are_refused_without_a_panic,
    ),
    (
        "the_page_in_chromium_shows_a_held_lock_then_its_release",
        &["chromium"],
        the_page_in_chromium_shows_a_held_lock_then_its_release,
    ),
    (
        "the_dashboard_queries_parse_and_use_documented_metrics",
        &["promtool"],
        the_dashboard_queries_parse_and_use_documented_metrics,
    ),
    (
        "a_composed_semaphore_is_listed_as_one_entry",
        &["promtool"],
        a_composed_semaphore_is_listed_as_one_entry,
    ),
    (
        "a_request_naming_another_host_is_refused_on_every_route",
        &[],
        a_request_naming_another_host_is_refused_on_every_route,
    ),
    (
        "a_burst_of_requests_is_served_by_one_store_scan",
        &["redis"],
        a_burst_of_requests_is_served_by_one_store_scan,
    ),
    (
        "a_listing_stops_at_max_locks_and_says_so",
        &["promtool"],
        a_listing_stops_at_max_locks_and_says_so,
    ),
    (
        "a_generated_break_token_is_never_printed",
        &[],
        a_generated_break_token_is_never_printed,
    ),
];

/// Whether this machine has `need` (a server of the test kit, or a tool on `PATH`).
fn installed(need: &str) -> bool {
    match need {
        "redis" => find_binary(&Redis::default()).is_some(),
        "postgres" => find_binary(&Postgres::default()).is_some(),
        "mariadb" => find_binary(&Mariadb::default()).is_some(),
        "etcd" => Etcd::single().is_ok_and(|etcd| find_binary(&etcd).is_some()),
        "zookeeper" => zookeeper_installed(),
        tool => find_tool(tool).is_some(),
    }
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for &(name, needs, test) in TESTS {
        let missing: Vec<&str> = needs
            .iter()
            .copied()
            .filter(|need| !required(need) && !installed(need))
            .collect();
        if !missing.is_empty() {
            eprintln!("ignored: {name} needs {} (not found)", missing.join(", "));
        }
        let trial = Trial::test(name, move || {
            std::panic::catch_unwind(test).map_err(|panic| {
                let text = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "panicked".into());
                Failed::from(text)
            })
        });
        trials.push(trial.with_ignored_flag(!missing.is_empty()));
    }
    libtest_mimic::run(&args, trials).exit();
}

fn dlock(url: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock"));
    cmd.arg("--url")
        .arg(url)
        .env_remove("DLOCK_URL")
        .env_remove("DLOCK_LABEL")
        .env_remove("DLOCK_BREAK_TOKEN");
    cmd
}

/// A running `dlock serve` on a free loopback port; killed on drop.
struct Serve {
    child: Child,
    addr: SocketAddr,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl Serve {
    fn start(url: &str, extra: &[&str]) -> Serve {
        Serve::start_with(dlock(url), extra)
    }

    /// As [`start`](Self::start), from a `dlock --url …` command set up by the caller.
    fn start_with(mut command: Command, extra: &[&str]) -> Serve {
        let dir = tempfile::tempdir().unwrap();
        let stderr = dir.path().join("serve.stderr");
        let mut child = command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .strip_prefix("serving http://")
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_else(|| {
                panic!(
                    "dlock serve printed {line:?}; stderr: {}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                )
            })
            .parse()
            .unwrap();
        assert!(
            !line.contains(REDIS_PASSWORD),
            "the store's password was printed: {line}"
        );
        Serve {
            child,
            addr,
            stderr,
            _dir: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn get(&self, path: &str) -> (u16, String) {
        http(self.addr, "GET", path, &[], "")
    }

    fn locks(&self, prefix: &str) -> Vec<serde_json::Value> {
        let (status, body) = self.get(&format!("/api/locks?prefix={prefix}"));
        assert_eq!(status, 200, "{body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        json["locks"].as_array().unwrap().clone()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request on a fresh connection: the status and the body.
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    http_as(addr, Some(&addr.to_string()), method, path, headers, body)
}

/// As [`http`], with the given `Host` header (or none).
fn http_as(
    addr: SocketAddr,
    host: Option<&str>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let host = host
        .map(|host| format!("Host: {host}\r\n"))
        .unwrap_or_default();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\n{host}Connection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    // The head, then as many bytes as Content-Length says (Chromium's DevTools server keeps
    // the connection open whatever the request asks).
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        head.push_str(&line);
    }
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let lower = head.to_ascii_lowercase();
    assert!(
        !lower.contains("transfer-encoding: chunked"),
        "a chunked reply; this client reads sized bodies only: {head}"
    );
    let length: usize = lower
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .map(|n| n.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("no Content-Length: {head}"));
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    (status, String::from_utf8(body).unwrap())
}

/// A `dlock hold NAME` process: holding once `fence` is `Some`, waiting before.
struct Hold {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Hold {
    /// Starts a hold without waiting for it to be granted.
    fn spawn(url: &str, name: &str, label: &str) -> Hold {
        Hold::spawn_with(url, name, label, &[])
    }

    /// As [`spawn`](Self::spawn), with more `dlock hold` arguments.
    fn spawn_with(url: &str, name: &str, label: &str, extra: &[&str]) -> Hold {
        let mut child = dlock(url)
            .args(["--label", label, "hold", name])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Hold {
            child,
            stdin,
            stdout,
        }
    }

    /// Waits until the hold is granted; its fence.
    fn granted(&mut self) -> u64 {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim()
            .strip_prefix("acquired ")
            .unwrap_or_else(|| panic!("dlock hold printed {line:?}"))
            .parse()
            .unwrap()
    }

    /// Releases (closes stdin) and waits for the process to end.
    fn release(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "dlock hold ended with {status}");
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` until it returns `Some`, failing after `limit` with what it last saw.
fn eventually<T>(what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let limit = Duration::from_secs(20);
    let start = Instant::now();
    loop {
        match check() {
            Ok(value) => return value,
            Err(seen) if start.elapsed() > limit => {
                panic!("{what} (after {limit:?}); last seen: {seen}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The value of the sample of `metric` whose labels include every `name="value"` of
/// `labels`, in the Prometheus text `body`.
fn sample(body: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    body.lines().find_map(|line| {
        let rest = line.strip_prefix(metric)?;
        let (label_part, value) = if let Some(rest) = rest.strip_prefix('{') {
            let (inside, value) = rest.rsplit_once("} ")?;
            (inside, value)
        } else {
            ("", rest.strip_prefix(' ')?)
        };
        labels
            .iter()
            .all(|(name, value)| label_part.contains(&format!("{name}=\"{value}\"")))
            .then(|| value.trim().parse().ok())?
    })
}

/// A tool from `PATH`, or `None`.
fn find_tool(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    })
}

/// A tool the running test needs (the harness ran it, so it is installed or required).
fn tool(name: &str, package: &str) -> PathBuf {
    find_tool(name).unwrap_or_else(|| {
        panic!(
            "{name} is required (DLOCK_TEST_REQUIRE) but not on PATH: install Debian's {package}"
        )
    })
}

/// `promtool check metrics` on `body`: Prometheus's own parser and linter.
fn promtool_accepts(body: &str) {
    let promtool = tool("promtool", "prometheus");
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics refused /metrics:\n{}{}\n--- /metrics ---\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A held lock and a waiter, as `/api/locks` and `/metrics` show them, then the hand-off and
/// the release: the same checks on every store.
/// How many waiters the store reports for a lock with `n` waiting: Redlock keeps no queue.
fn counted(url: &str, n: u64) -> serde_json::Value {
    if url.starts_with("redlock") {
        serde_json::Value::Null
    } else {
        n.into()
    }
}

fn held_lock_and_waiter_are_served(url: &str) {
    let serve = Serve::start(url, &[]);
    let name = "obs/held";
    let mut holder = Hold::spawn(url, name, "first-holder");
    let fence = holder.granted();
    let mut waiter = Hold::spawn(url, name, "second-holder");

    let lock = eventually("the held lock with one waiter in /api/locks", || {
        let locks = serve.locks("obs/");
        match locks.as_slice() {
            [lock] if lock["waiters"] == counted(url, 1) => Ok(lock.clone()),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(lock["name"], name);
    assert_eq!(lock["fence"], fence);
    assert_eq!(lock["label"], "first-holder");
    assert_eq!(lock["kind"], "mutex");
    assert_eq!(lock["holds"], 1);
    assert!(lock["ttl_left_ms"].as_u64().unwrap() > 0, "{lock}");

    let (status, metrics) = serve.get("/metrics");
    assert_eq!(status, 200, "{metrics}");
    let at = |metric: &str, labels: &[(&str, &str)]| sample(&metrics, metric, labels);
    assert_eq!(at("dlock_store_up", &[]), Some(1.0), "{metrics}");
    let named = [("name", name)];
    assert_eq!(
        at("dlock_lock_held", &[("name", name), ("kind", "mutex")]),
        Some(1.0),
        "{metrics}"
    );
    let waiting = counted(url, 1).as_f64();
    assert_eq!(at("dlock_lock_waiters", &named), waiting, "{metrics}");
    #[allow(clippy::cast_precision_loss)]
    let fence_value = fence as f64;
    assert_eq!(
        at("dlock_lock_fence", &named),
        Some(fence_value),
        "{metrics}"
    );
    assert!(
        at("dlock_lock_ttl_seconds", &named).unwrap() > 0.0,
        "{metrics}"
    );
    assert_eq!(
        at(
            "dlock_lock_holder",
            &[("name", name), ("label", "first-holder")]
        ),
        Some(1.0),
        "{metrics}"
    );
    if waiting.is_some() {
        assert!(at("dlock_store_waiters", &[]).unwrap() >= 1.0, "{metrics}");
    }
    promtool_accepts(&metrics);

    // The waiter takes over: a greater fence, nobody waiting.
    holder.release();
    let next = waiter.granted();
    assert!(next > fence);
    eventually("the new holder without waiters in /api/locks", || {
        let locks = serve.locks("obs/");
        match locks.as_slice() {
            [lock] if lock["fence"] == next && lock["waiters"] == counted(url, 0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    // Released: gone from both.
    waiter.release();
    eventually("no lock in /api/locks after the release", || {
        let locks = serve.locks("obs/");
        if locks.is_empty() {
            Ok(())
        } else {
            Err(format!("{locks:?}"))
        }
    });
    let (_, metrics) = serve.get("/metrics");
    assert_eq!(
        sample(&metrics, "dlock_lock_held", &named),
        None,
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "dlock_store_locks_held", &[("kind", "mutex")]),
        Some(0.0),
        "{metrics}"
    );
    promtool_accepts(&metrics);
    assert!(!serve.stderr().contains(REDIS_PASSWORD));
}

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

fn sqlite_held_lock_and_waiter_appear_in_metrics_and_api() {
    let dir = tempfile::tempdir().unwrap();
    held_lock_and_waiter_are_served(&sqlite_url(dir.path()));
}

/// A Redis server with a password.
fn redis_with_password() -> (ServerProcess, String) {
    let redis = Redis {
        extra_args: vec!["--requirepass".into(), REDIS_PASSWORD.into()],
    };
    match ServerProcess::start(redis) {
        Ok(server) => {
            let url = format!("redis://:{REDIS_PASSWORD}@127.0.0.1:{}", server.port());
            (server, url)
        }
        Err(e) => panic!("{e}"),
    }
}

fn redis_held_lock_and_waiter_appear_in_metrics_and_api() {
    let (_server, url) = redis_with_password();
    held_lock_and_waiter_are_served(&url);
}

/// The lease-table mode of a SQL store the test kit starts.
fn sql_lease_table_held_lock_and_waiter_are_served<K: SqlServer>() {
    let fixtures = SqlFixture::<K>::start_both().unwrap();
    let lease_table = fixtures
        .iter()
        .find(|f| !f.backend().ends_with("session"))
        .expect("the SQL server: installed or required");
    held_lock_and_waiter_are_served(&lease_table.url().unwrap());
}

fn postgres_held_lock_and_waiter_appear_in_metrics_and_api() {
    sql_lease_table_held_lock_and_waiter_are_served::<Postgres>();
}

fn mariadb_held_lock_and_waiter_appear_in_metrics_and_api() {
    sql_lease_table_held_lock_and_waiter_are_served::<Mariadb>();
}

fn etcd_held_lock_and_waiter_appear_in_metrics_and_api() {
    let etcd = EtcdFixture::start()
        .unwrap()
        .expect("etcd: installed or required");
    held_lock_and_waiter_are_served(&etcd.url().unwrap());
}

fn zookeeper_held_lock_and_waiter_appear_in_metrics_and_api() {
    let zookeeper = ZookeeperFixture::start()
        .unwrap()
        .expect("ZooKeeper: installed or required");
    held_lock_and_waiter_are_served(&zookeeper.url().unwrap());
}

fn redlock_held_lock_appears_in_metrics_and_api_without_a_waiter_count() {
    let nodes = match dlock_testkit::server::RedisNodes::start(3) {
        Ok(nodes) => nodes,
        Err(e) => panic!("{e}"),
    };
    held_lock_and_waiter_are_served(&dlock_testkit::fixture::redlock_url(&nodes.addrs()));
}

fn the_store_password_is_never_served() {
    let (_server, url) = redis_with_password();
    let serve = Serve::start(&url, &["--allow-break", "--break-token", "t0ken"]);
    let mut holder = Hold::spawn(&url, "secret/x", "holder");
    holder.granted();
    for path in ["/", "/page.js", "/api/locks", "/metrics"] {
        let (status, body) = serve.get(path);
        assert_eq!(status, 200, "{path}: {body}");
        assert!(!body.contains(REDIS_PASSWORD), "{path} shows the password");
    }
    let (_, api) = serve.get("/api/locks");
    let api: serde_json::Value = serde_json::from_str(&api).unwrap();
    assert!(api["store"].as_str().unwrap().contains(":***@"), "{api}");
    assert!(!serve.stderr().contains(REDIS_PASSWORD));
}

fn breaking_needs_allow_break_and_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let mut holder = Hold::spawn(&url, "jobs/a", "holder");
    holder.granted();
    let body = r#"{"name": "jobs/a"}"#;
    let json = ("content-type", "application/json");

    // Read-only by default: refused even with a token.
    let read_only = Serve::start(&url, &[]);
    let (status, reply) = http(
        read_only.addr,
        "POST",
        "/api/break",
        &[json, ("x-dlock-break-token", "anything")],
        body,
    );
    assert_eq!(status, 403, "{reply}");
    assert_eq!(read_only.locks("jobs/").len(), 1);

    let serve = Serve::start(&url, &["--allow-break", "--break-token", "right-token"]);
    // No token, a wrong token, a lock outside the served prefix: refused, the lock stays.
    let (status, _) = http(serve.addr, "POST", "/api/break", &[json], body);
    assert_eq!(status, 403);
    let (status, _) = http(
        serve.addr,
        "POST",
        "/api/break",
        &[json, ("x-dlock-break-token", "wrong-token")],
        body,
    );
    assert_eq!(status, 403);
    // Bad input: a typed error, nothing broken.
    let (status, reply) = http(
        serve.addr,
        "POST",
        "/api/break",
        &[json, ("x-dlock-break-token", "right-token")],
        "not json",
    );
    assert_eq!(status, 400, "{reply}");
    let (status, reply) = http(
        serve.addr,
        "POST",
        "/api/break",
        &[json, ("x-dlock-break-token", "right-token")],
        r#"{"name": ""}"#,
    );
    assert_eq!(status, 400, "{reply}");
    assert_eq!(serve.locks("jobs/").len(), 1);

    let (status, reply) = http(
        serve.addr,
        "POST",
        "/api/break",
        &[json, ("x-dlock-break-token", "right-token")],
        body,
    );
    assert_eq!(status, 200, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(reply["broken"], true);
    assert!(serve.locks("jobs/").is_empty());
    // The holder learns it lost the lock (dlock hold exits with its "lost" code).
    let status = holder.child.wait().unwrap();
    assert!(!status.success());
}

fn bad_serve_arguments_are_refused_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    for args in [
        vec!["serve", "--listen", "not-an-address"],
        vec!["serve", "--break-token", "x"],
        vec!["serve", "--allow-break", "--break-token", ""],
        vec!["serve", "--allow-host", ""],
        vec!["serve", "--allow-host", "a b"],
        vec!["serve", "--allow-host", "user@host"],
        vec!["serve", "--max-locks", "0"],
        vec!["serve", "--list-interval", "-1s"],
    ] {
        let out = dlock(&url).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(!stderr.is_empty(), "{args:?} failed without a word");
    }
    // A listing with a NUL byte in the prefix: a typed 400, the server goes on.
    let serve = Serve::start(&url, &[]);
    let (status, body) = serve.get("/api/locks?prefix=a%00b");
    assert_eq!(status, 400, "{body}");
    let (status, _) = serve.get("/api/locks");
    assert_eq!(status, 200);
}

/// A headless Chromium with its DevTools HTTP endpoint; killed on drop.
struct Browser {
    child: Child,
    devtools: SocketAddr,
    _profile: tempfile::TempDir,
}

/// The flags every headless run here needs: no sandbox (the tests may run as root), no GPU,
/// a throwaway profile.
fn chromium_command(chromium: &Path, profile: &Path) -> Command {
    let mut cmd = Command::new(chromium);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-dev-shm-usage",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    cmd
}

impl Browser {
    fn start(chromium: &Path) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let mut child = chromium_command(chromium, profile.path())
            .args(["--remote-debugging-port=0", "about:blank"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let mut seen = Vec::new();
        let mut devtools = None;
        for line in stderr.lines() {
            let line = line.unwrap();
            if let Some(rest) = line.strip_prefix("DevTools listening on ws://") {
                devtools = rest.split('/').next().map(|addr| addr.parse().unwrap());
                break;
            }
            seen.push(line);
        }
        let devtools =
            devtools.unwrap_or_else(|| panic!("chromium gave no DevTools address: {seen:?}"));
        Browser {
            child,
            devtools,
            _profile: profile,
        }
    }

    /// Opens `url` in a new tab.
    fn open(&self, url: &str) {
        let (status, body) = http(self.devtools, "PUT", &format!("/json/new?{url}"), &[], "");
        assert_eq!(status, 200, "{body}");
    }

    /// The titles of the open pages.
    fn titles(&self) -> Vec<String> {
        let (status, body) = http(self.devtools, "GET", "/json/list", &[], "");
        assert_eq!(status, 200, "{body}");
        let targets: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        targets
            .iter()
            .filter(|t| t["type"] == "page")
            .map(|t| t["title"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The page as Chromium rendered it after its script ran: the DOM, serialized.
fn rendered_dom(chromium: &Path, url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = chromium_command(chromium, profile.path())
        .args(["--dump-dom", "--virtual-time-budget=5000", url])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium --dump-dom failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn the_page_in_chromium_shows_a_held_lock_then_its_release() {
    let chromium = tool("chromium", "chromium");
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let serve = Serve::start(&url, &[]);
    let mut holder = Hold::spawn(&url, "page/held <b>x</b>", "page-holder");
    holder.granted();
    let _elsewhere = {
        let mut other = Hold::spawn(&url, "other/lock", "other-holder");
        other.granted();
        other
    };

    // The rendered table: the held lock under the prefix, as text (the markup in its name
    // is not markup), and not the lock outside the prefix.
    let dom = rendered_dom(&chromium, &serve.url("/?prefix=page/"));
    assert!(
        dom.contains("page/held &lt;b&gt;x&lt;/b&gt;"),
        "the held lock is not in the page:\n{dom}"
    );
    assert!(dom.contains("page-holder"), "{dom}");
    assert!(
        !dom.contains("<b>x</b>"),
        "a lock name became markup:\n{dom}"
    );
    assert!(
        !dom.contains("other/lock"),
        "the prefix filter let other/lock in:\n{dom}"
    );

    // One page left open refreshes itself: it shows the lock, then its release.
    let browser = Browser::start(&chromium);
    browser.open(&serve.url("/?prefix=page/&every=250"));
    eventually("the open page showing the held lock", || {
        let titles = browser.titles();
        if titles.iter().any(|t| t == "dlock: 1 held under page/") {
            Ok(())
        } else {
            Err(format!("{titles:?}"))
        }
    });
    holder.release();
    eventually("the open page showing the release", || {
        let titles = browser.titles();
        if titles.iter().any(|t| t == "dlock: 0 held under page/") {
            Ok(())
        } else {
            Err(format!("{titles:?}"))
        }
    });
}

/// The repository's Grafana dashboard: every query parses as PromQL (`promtool check rules`
/// on a rule file made of them) and names only metrics documented in OBSERVABILITY.md.
fn the_dashboard_queries_parse_and_use_documented_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("dashboards/dlock.json")).unwrap())
            .unwrap();
    let documented = std::fs::read_to_string(root.join("OBSERVABILITY.md")).unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            // Grafana's variables, as Grafana would fill them in.
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "5m")
                .replace("$backend", ".*");
            exprs.push(expr);
        }
    }
    assert!(exprs.len() > 10, "{exprs:?}");
    for expr in &exprs {
        let names = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("dlock_"));
        for name in names {
            let base = name
                .strip_suffix("_count")
                .or_else(|| name.strip_suffix("_sum"))
                .unwrap_or(name);
            assert!(
                documented.contains(&format!("`{base}`")),
                "{name} (in {expr}) is not in OBSERVABILITY.md's table"
            );
        }
    }
    let promtool = tool("promtool", "prometheus");
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("dashboard-rules.yml");
    let mut text = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in exprs.iter().enumerate() {
        text.push_str(&format!(
            "      - record: dashboard_query_{i}\n        expr: {}\n",
            serde_json::Value::String(expr.clone())
        ));
    }
    std::fs::write(&rules, text).unwrap();
    let out = Command::new(promtool)
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A composed semaphore (SQLite has no native one) is one entry, not one per permit slot.
fn a_composed_semaphore_is_listed_as_one_entry() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let serve = Serve::start(&url, &[]);
    let mut first = Hold::spawn_with(&url, "sem/pool", "first", &["--permits", "3"]);
    first.granted();
    let mut second = Hold::spawn_with(&url, "sem/pool", "second", &["--permits", "3"]);
    second.granted();
    let locks = serve.locks("sem/");
    let [pool] = locks.as_slice() else {
        panic!("{locks:?}");
    };
    assert_eq!(pool["name"], "sem/pool");
    assert_eq!(pool["kind"], "permit");
    assert_eq!(pool["holds"], 2);
    let (_, metrics) = serve.get("/metrics");
    assert_eq!(
        sample(
            &metrics,
            "dlock_lock_held",
            &[("name", "sem/pool"), ("kind", "permit")]
        ),
        Some(1.0),
        "{metrics}"
    );
    promtool_accepts(&metrics);
    // The raw parts are still there for whoever asks.
    let out = dlock(&url)
        .args(["ls", "sem/", "--json", "--parts"])
        .output()
        .unwrap();
    let parts: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(parts.len(), 2, "{parts:?}");
    assert!(
        parts
            .iter()
            .all(|p| p["name"].as_str().unwrap().starts_with("sem/pool#p")),
        "{parts:?}"
    );
    first.release();
    second.release();
}

/// A page of another site whose name was made to resolve to this server (DNS rebinding)
/// sends its own name in `Host`: refused on every route, with a short text. The names the
/// server is reached by, and those given with `--allow-host`, are answered.
fn a_request_naming_another_host_is_refused_on_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let mut holder = Hold::spawn(&url, "rebind/held", "holder");
    holder.granted();
    let serve = Serve::start(
        &url,
        &[
            "--allow-break",
            "--break-token",
            "right-token",
            "--allow-host",
            "locks.internal",
        ],
    );
    let port = serve.addr.port();
    let foreign = format!("evil.example:{port}");
    let break_headers = [
        ("content-type", "application/json"),
        ("x-dlock-break-token", "right-token"),
    ];
    for host in [
        Some("evil.example"),
        Some(foreign.as_str()),
        Some("other.internal"),
        None,
    ] {
        for (method, path) in [
            ("GET", "/"),
            ("GET", "/page.js"),
            ("GET", "/api/locks"),
            ("GET", "/metrics"),
            ("GET", "/no-such-page"),
            ("POST", "/api/break"),
        ] {
            let (status, body) = http_as(
                serve.addr,
                host,
                method,
                path,
                &break_headers,
                r#"{"name": "rebind/held"}"#,
            );
            assert!(
                status == 421 || (host.is_none() && status == 400),
                "{method} {path} with Host {host:?}: {status} {body}"
            );
            assert!(
                !body.contains("rebind/held"),
                "{path} showed a lock: {body}"
            );
        }
    }
    // Nothing was broken by the refused break.
    assert_eq!(serve.locks("rebind/").len(), 1);
    let (status, body) = http_as(serve.addr, Some("evil.example"), "GET", "/", &[], "");
    assert_eq!(status, 421);
    assert!(body.contains("--allow-host"), "{body}");

    let with_port = |name: &str| format!("{name}:{port}");
    for host in [
        serve.addr.to_string(),
        "127.0.0.1".into(),
        "localhost".into(),
        with_port("localhost"),
        with_port("[::1]"),
        "locks.internal".into(),
        with_port("Locks.Internal"),
    ] {
        let (status, body) = http_as(serve.addr, Some(&host), "GET", "/api/locks", &[], "");
        assert_eq!(status, 200, "Host {host}: {body}");
        assert!(body.contains("rebind/held"), "Host {host}: {body}");
    }
    holder.release();
}

/// A Redis server of the test kit without a password.
fn redis_server() -> ServerProcess {
    ServerProcess::start(Redis::default()).unwrap_or_else(|e| panic!("{e}"))
}

/// How many `SCAN` commands the Redis server at `addr` has run (`INFO commandstats`).
fn scan_calls(addr: SocketAddr) -> u64 {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(b"INFO commandstats\r\n").unwrap();
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    reader.read_line(&mut head).unwrap();
    let length: usize = head
        .trim_end()
        .strip_prefix('$')
        .unwrap_or_else(|| panic!("INFO answered {head:?}"))
        .parse()
        .unwrap();
    let mut text = vec![0; length];
    reader.read_exact(&mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("cmdstat_scan:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// Requests that arrive together share one listing of the store: a burst of page, API and
/// metrics requests makes the store run as many `SCAN`s as one listing does, and another
/// burst within the listing interval none.
fn a_burst_of_requests_is_served_by_one_store_scan() {
    let server = redis_server();
    let url = format!("redis://{}", server.addr());
    let mut holder = Hold::spawn(&url, "burst/held", "holder");
    holder.granted();

    // What one listing costs, on a server of its own.
    let before_one = scan_calls(server.addr());
    {
        let single = Serve::start(&url, &["--list-interval", "0s"]);
        assert_eq!(single.locks("burst/").len(), 1);
    }
    let one_listing = scan_calls(server.addr()) - before_one;
    assert!(one_listing > 0, "a listing ran no SCAN");

    let serve = Serve::start(&url, &["--list-interval", "10m"]);
    let burst = |serve: &Serve| {
        let paths = ["/api/locks", "/api/locks?prefix=burst/", "/metrics"];
        let start = std::sync::Barrier::new(24);
        std::thread::scope(|scope| {
            let replies: Vec<_> = (0..24)
                .map(|i| {
                    let start = &start;
                    let path = paths[i % paths.len()];
                    scope.spawn(move || {
                        start.wait();
                        (path, serve.get(path))
                    })
                })
                .collect();
            for reply in replies {
                let (path, (status, body)) = reply.join().unwrap();
                assert_eq!(status, 200, "{path}: {body}");
                assert!(body.contains("burst/held"), "{path}: {body}");
            }
        });
    };
    let before = scan_calls(server.addr());
    burst(&serve);
    let first_burst = scan_calls(server.addr()) - before;
    assert_eq!(
        first_burst, one_listing,
        "24 requests arriving together ran {first_burst} SCANs; one listing runs {one_listing}"
    );
    let before = scan_calls(server.addr());
    burst(&serve);
    let second_burst = scan_calls(server.addr()) - before;
    assert_eq!(
        second_burst, 0,
        "a burst within the listing interval scanned the store again"
    );
    holder.release();
}

/// One listing reads at most `--max-locks` locks from the store and says when it stopped
/// short, in the JSON and in the metrics.
fn a_listing_stops_at_max_locks_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let holders: Vec<Hold> = ["cap/a", "cap/b", "cap/c"]
        .into_iter()
        .map(|name| {
            let mut hold = Hold::spawn(&url, name, "holder");
            hold.granted();
            hold
        })
        .collect();
    let capped = Serve::start(&url, &["--max-locks", "2"]);
    let (status, body) = capped.get("/api/locks");
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["truncated"], true, "{json}");
    assert_eq!(json["locks"].as_array().unwrap().len(), 2, "{json}");
    let (_, metrics) = capped.get("/metrics");
    assert_eq!(
        sample(&metrics, "dlock_store_list_truncated", &[]),
        Some(1.0),
        "{metrics}"
    );
    promtool_accepts(&metrics);

    let whole = Serve::start(&url, &[]);
    let (_, body) = whole.get("/api/locks");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["truncated"], false, "{json}");
    assert_eq!(json["locks"].as_array().unwrap().len(), 3, "{json}");
    for hold in holders {
        hold.release();
    }
}

/// `--allow-break` without a token makes one, and never prints it (logs collect the output):
/// it is written to a file only this user can read, whose path is printed; the token in it
/// breaks a lock, and the file is gone once the server stops.
fn a_generated_break_token_is_never_printed() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let runtime_dir = tempfile::tempdir().unwrap();
    let mut holder = Hold::spawn(&url, "token/held", "holder");
    holder.granted();
    let mut command = dlock(&url);
    command.env("XDG_RUNTIME_DIR", runtime_dir.path());
    let mut serve = Serve::start_with(command, &["--allow-break"]);
    let stderr = serve.stderr();
    let path = stderr
        .lines()
        .find_map(|line| line.strip_prefix("dlock serve: break token in "))
        .and_then(|rest| rest.split(" (").next())
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no token file named on stderr: {stderr}"));
    assert!(path.starts_with(runtime_dir.path()), "{}", path.display());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the token file is mode {mode:o}");
    let token = std::fs::read_to_string(&path).unwrap().trim().to_owned();
    assert!(token.len() >= 32, "a short token: {} bytes", token.len());
    assert!(
        !stderr.contains(&token),
        "the break token was printed on stderr"
    );

    let (status, reply) = http(
        serve.addr,
        "POST",
        "/api/break",
        &[
            ("content-type", "application/json"),
            ("x-dlock-break-token", &token),
        ],
        r#"{"name": "token/held"}"#,
    );
    assert_eq!(status, 200, "{reply}");
    assert!(!holder.child.wait().unwrap().success());

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(serve.child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    serve.child.wait().unwrap();
    assert!(!path.exists(), "the token file outlived the server");
    assert!(
        !serve.stderr().contains(&token),
        "the break token was printed on stderr"
    );
}
