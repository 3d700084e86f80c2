//! `dlock serve`: the store's held locks over HTTP, for people and for Prometheus.
//!
//! - `/metrics`: Prometheus text format: one series set per held lock (held, TTL left, age,
//!   fence, holds, waiters where the store counts them), totals, and whatever the `dlock`
//!   library recorded in this process (its `metrics` facade, rendered by the same exporter).
//! - `/api/locks?prefix=P`: the same locks as JSON (the entries of `dlock ls --json`).
//! - `/`: a page that lists them, refreshes itself and filters by prefix. It only reads,
//!   unless `--allow-break`: then each lock has a button that asks for confirmation and the
//!   break token before `POST /api/break`.
//!
//! Everything the store holds is shown as text (the page never inserts it as HTML) and the
//! store URL is shown redacted. Every route answers only requests whose `Host` names this
//! server (DNS rebinding would let any web page read it otherwise); one store scan, of at
//! most `--max-locks` entries, serves every request that arrives within `--list-interval`;
//! a generated break token goes to a file only this user can read, never to the output.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::Json;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Args;
use futures::TryStreamExt;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::json;

use crate::inspect::to_json;
use crate::shown::shown;
use crate::signals::Signals;
use crate::{connect, fail};

/// The page and its script, served as they are (the script is a file of its own so the page's
/// Content-Security-Policy can forbid inline scripts).
const PAGE: &str = include_str!("serve/page.html");
const SCRIPT: &str = include_str!("serve/page.js");

/// The header a break request carries its token in. A custom header also keeps other sites'
/// pages from posting a break: a browser asks first (CORS preflight), and nothing here answers.
const TOKEN_HEADER: &str = "x-dlock-break-token";

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address and port to listen on. Loopback by default: the page shows who holds what
    /// (hosts, pids, labels); listen elsewhere only behind your own access control.
    #[arg(long, default_value = "127.0.0.1:9477")]
    listen: SocketAddr,

    /// Another name this server is reached by (a DNS name, or `name:port`), repeatable.
    /// Requests whose `Host` header names neither the listen address (nor, on loopback,
    /// `localhost`, `127.0.0.1` or `[::1]`) nor one of these are refused with 421.
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_hosts: Vec<String>,

    /// Only locks whose names start with this (requests can narrow it further, not widen it).
    #[arg(long, default_value = "")]
    prefix: String,

    /// How long one listing of the store serves the requests that follow it (the page,
    /// /api/locks and /metrics share it); 0 lists afresh for each request.
    #[arg(long, default_value = "1s", value_parser = crate::parse_duration)]
    list_interval: Duration,

    /// The most locks one listing reads from the store; beyond it the listing is cut short
    /// and says so (`"truncated": true`, `dlock_store_list_truncated 1`).
    #[arg(long, default_value_t = DEFAULT_MAX_LOCKS, value_parser = clap::value_parser!(u32).range(1..))]
    max_locks: u32,

    /// Let the page break locks: each break asks for confirmation and the break token.
    #[arg(long)]
    allow_break: bool,

    /// The token a break must present (with --allow-break). Without it, a random one is made
    /// and written to a file only this user can read, whose path is printed on stderr at
    /// start (the file is removed when the server stops).
    #[arg(
        long,
        env = "DLOCK_BREAK_TOKEN",
        hide_env_values = true,
        requires = "allow_break"
    )]
    break_token: Option<String>,
}

/// `--max-locks` unless told otherwise: ten times the listing OBSERVABILITY.md measures.
const DEFAULT_MAX_LOCKS: u32 = 100_000;

#[derive(Debug)]
struct Served {
    locks: dlock::Locks,
    /// The store URL with every credential replaced, as shown on the page and in the JSON.
    store: String,
    prefix: String,
    /// `Some` when breaking is allowed.
    break_token: Option<BreakToken>,
    /// What the library recorded in this process through the `metrics` facade.
    library: Option<PrometheusHandle>,
    /// The last listing of the served prefix, shared by the requests that follow it.
    listing: ListCache,
}

/// The token a break must present; kept out of `Debug` so no log can show it.
struct BreakToken(String);

impl std::fmt::Debug for BreakToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BreakToken(***)")
    }
}

/// A generated break token's file, removed when the server stops.
struct TokenFile(PathBuf);

impl Drop for TokenFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Writes a generated break token to a new file that only this user can read: in
/// `$XDG_RUNTIME_DIR` (a directory of this user's own) when there is one, else the temporary
/// directory. The name is new and created exclusively, so nothing another user put there
/// (a file, a symbolic link) is written through.
fn write_token_file(token: &str) -> std::io::Result<TokenFile> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute() && dir.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!(
        "dlock-serve-{}-{}.token",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    let file_guard = TokenFile(path);
    file.write_all(token.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    Ok(file_guard)
}

/// The names a request's `Host` may give for this server, lower case, each with and without
/// the port.
#[derive(Debug)]
struct AllowedHosts(Vec<String>);

impl AllowedHosts {
    /// The address bound (and, on loopback, `localhost`, `127.0.0.1` and `[::1]`), and the
    /// `--allow-host` names; an error names an `--allow-host` value that is not a host name.
    fn new(bound: SocketAddr, extra: &[String]) -> Result<AllowedHosts, String> {
        let port = bound.port();
        let mut names = vec![host_text(bound.ip())];
        if bound.ip().is_loopback() {
            names.extend(["localhost", "127.0.0.1", "[::1]"].map(String::from));
        }
        let mut allowed = Vec::new();
        for name in names {
            allowed.push(format!("{name}:{port}"));
            allowed.push(name);
        }
        for given in extra {
            let name = match given.parse::<IpAddr>() {
                Ok(ip) => host_text(ip),
                Err(_) => given.to_ascii_lowercase(),
            };
            // A `:` after the host (outside an IPv6 literal's brackets) must start a port.
            let after_host = name
                .rsplit_once(']')
                .map_or(name.as_str(), |(_, rest)| rest);
            let authority = name
                .parse::<axum::http::uri::Authority>()
                .ok()
                .filter(|a| !name.contains('@') && !a.host().is_empty())
                .filter(|a| !after_host.contains(':') || a.port_u16().is_some());
            let Some(authority) = authority else {
                return Err(format!(
                    "--allow-host {}: not a host name (examples: locks.internal, \
                     locks.internal:9477, 10.0.0.5)",
                    crate::shown::shown(given)
                ));
            };
            if authority.port_u16().is_none() {
                allowed.push(format!("{name}:{port}"));
            }
            allowed.push(name);
        }
        Ok(AllowedHosts(allowed))
    }

    fn allows(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        self.0.contains(&host)
    }
}

/// An address as a `Host` header gives it: IPv6 in brackets.
fn host_text(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    }
}

/// Refuses, on every route, a request that names another server in `Host` (or none): a page
/// of another site whose name was made to resolve here (DNS rebinding) sends its own name.
async fn check_host(
    State(hosts): State<Arc<AllowedHosts>>,
    request: Request,
    next: Next,
) -> Response {
    let header = request
        .headers()
        .get(header::HOST)
        .map(|value| value.to_str().ok().filter(|host| hosts.allows(host)));
    // An absolute-form target names the server too; it must agree.
    let target_ok = request
        .uri()
        .authority()
        .is_none_or(|authority| hosts.allows(authority.as_str()));
    if matches!(header, Some(Some(_))) && target_ok {
        return next.run(request).await;
    }
    secured(
        (
            StatusCode::MISDIRECTED_REQUEST,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "dlock serve answers only to the names it is reached by; \
             start it with --allow-host NAME to add one\n",
        )
            .into_response(),
    )
}

/// One listing of the served prefix: what a store scan found, at most `--max-locks` of it.
#[derive(Debug)]
struct Listing {
    /// Sorted by name, a composed primitive as one entry.
    locks: Vec<dlock::LockInfo>,
    /// Whether the scan stopped at `--max-locks` with more left.
    truncated: bool,
    /// How long the scan took.
    took: Duration,
}

type Listed = Result<Arc<Listing>, Arc<dlock::Error>>;

/// The last listing, and when it was made. The lock is held across a scan, so requests that
/// arrive during one wait for it and share it instead of scanning again.
#[derive(Debug)]
struct ListCache {
    interval: Duration,
    max_locks: usize,
    last: tokio::sync::Mutex<Option<(Instant, Listed)>>,
}

impl ListCache {
    /// The last listing if it is younger than the interval, else a new one.
    async fn get(&self, locks: &dlock::Locks, prefix: &str) -> Listed {
        let mut last = self.last.lock().await;
        if let Some((made, listed)) = &*last
            && made.elapsed() < self.interval
        {
            return listed.clone();
        }
        let started = Instant::now();
        let listed = self.scan(locks, prefix).await.map(|(locks, truncated)| {
            Arc::new(Listing {
                locks,
                truncated,
                took: started.elapsed(),
            })
        });
        let listed = listed.map_err(Arc::new);
        *last = Some((started, listed.clone()));
        listed
    }

    /// At most `max_locks` held locks under `prefix`, and whether more were left.
    async fn scan(
        &self,
        locks: &dlock::Locks,
        prefix: &str,
    ) -> dlock::Result<(Vec<dlock::LockInfo>, bool)> {
        let mut stream = locks.list(prefix);
        let mut held = Vec::new();
        while let Some(info) = stream.try_next().await? {
            if held.len() == self.max_locks {
                return Ok((crate::composed::fold(held), true));
            }
            held.push(info);
        }
        Ok((crate::composed::fold(held), false))
    }

    /// Forgets the last listing: after a break here, the next request shows the change.
    async fn forget(&self) {
        *self.last.lock().await = None;
    }
}

pub(crate) async fn serve(url: &str, args: ServeArgs) -> i32 {
    if args.prefix.contains('\0') {
        eprintln!("dlock: --prefix must not contain a NUL byte");
        return crate::exit::FAILED;
    }
    if args.break_token.as_deref().is_some_and(str::is_empty) {
        eprintln!("dlock: --break-token must not be empty");
        return crate::exit::FAILED;
    }
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => return fail(&e.into()),
    };
    let locks = match connect(url, None).await {
        Ok(locks) => locks,
        Err(code) => return code,
    };
    if !locks.info().capabilities.list {
        eprintln!(
            "dlock: the {} store cannot list its locks: nothing to serve",
            locks.info().name
        );
        return crate::exit::FAILED;
    }
    // The library's own metrics in this process; another recorder already set (none here)
    // only means they are left out.
    let library = PrometheusBuilder::new().install_recorder().ok();
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("dlock: cannot listen on {}: {e}", args.listen);
            return crate::exit::FAILED;
        }
    };
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(e) => return fail(&e.into()),
    };
    let hosts = match AllowedHosts::new(addr, &args.allow_hosts) {
        Ok(hosts) => hosts,
        Err(message) => {
            eprintln!("dlock: {message}");
            return crate::exit::FAILED;
        }
    };
    if !addr.ip().is_loopback() {
        eprintln!(
            "dlock serve: listening on {addr}, not loopback: anyone who reaches it sees every \
             holder (name the host it is reached by with --allow-host)"
        );
    }
    // A generated token goes to a file of this user's, not to the output: logs collect
    // stderr, and whoever reads them could break locks.
    let mut token_file = None;
    let break_token = if !args.allow_break {
        None
    } else if let Some(token) = args.break_token {
        Some(BreakToken(token))
    } else {
        let token = uuid::Uuid::new_v4().simple().to_string();
        match write_token_file(&token) {
            Ok(file) => {
                eprintln!(
                    "dlock serve: break token in {} (readable by this user only; removed at exit)",
                    file.0.display()
                );
                token_file = Some(file);
            }
            Err(e) => {
                eprintln!(
                    "dlock: cannot write the break token file: {e} (give a token with \
                     --break-token or DLOCK_BREAK_TOKEN)"
                );
                return crate::exit::FAILED;
            }
        }
        Some(BreakToken(token))
    };
    let served = Arc::new(Served {
        locks,
        store: dlock::redact_url(url),
        prefix: args.prefix,
        break_token,
        library,
        listing: ListCache {
            interval: args.list_interval,
            max_locks: usize::try_from(args.max_locks).unwrap_or(usize::MAX),
            last: tokio::sync::Mutex::new(None),
        },
    });
    let app = router(served.clone(), Arc::new(hosts));
    // The first line of stdout says where to go (and which port, when asked for port 0).
    println!("serving http://{addr}/ (store {})", shown(&served.store));
    let shutdown = async move {
        signals.recv().await;
    };
    let code = match axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        Ok(()) => 0,
        Err(e) => fail(&e.into()),
    };
    drop(token_file);
    code
}

fn router(served: Arc<Served>, hosts: Arc<AllowedHosts>) -> axum::Router {
    axum::Router::new()
        .route("/", get(page))
        .route("/page.js", get(script))
        .route("/metrics", get(metrics))
        .route("/api/locks", get(api_locks))
        .route("/api/break", post(api_break))
        .with_state(served)
        .layer(axum::middleware::from_fn_with_state(hosts, check_host))
}

/// Headers every answer carries: nothing is cached (it is live state), the page may load only
/// its own script and data, and no other site may frame it.
fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; frame-ancestors 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

async fn page() -> Response {
    secured(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response())
}

async fn script() -> Response {
    secured(
        (
            [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
            SCRIPT,
        )
            .into_response(),
    )
}

#[derive(Debug, serde::Deserialize)]
struct ListQuery {
    #[serde(default)]
    prefix: String,
}

/// An error answered as JSON `{"error": …}` with its status.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    secured((status, Json(json!({ "error": message.into() }))).into_response())
}

/// The prefix to list for a request's `prefix`: the request may narrow the server's prefix,
/// never widen it. `None` when the two cannot overlap (nothing to list).
fn effective_prefix<'a>(server: &'a str, asked: &'a str) -> Option<&'a str> {
    if asked.starts_with(server) {
        Some(asked)
    } else if server.starts_with(asked) {
        Some(server)
    } else {
        None
    }
}

/// A request's prefix that no lock name could start with (as the library refuses it).
fn bad_prefix(asked: &str) -> Option<String> {
    (asked.len() > dlock::limits::MAX_NAME_LEN || asked.contains('\0')).then(|| {
        format!(
            "prefix {} is longer than {} bytes or contains a NUL byte",
            shown(&asked.chars().take(80).collect::<String>()),
            dlock::limits::MAX_NAME_LEN
        )
    })
}

/// The status a store error is answered with: the caller's fault or the store's.
fn status_of(e: &dlock::Error) -> StatusCode {
    match e {
        dlock::Error::InvalidName { .. } | dlock::Error::InvalidArgument { .. } => {
            StatusCode::BAD_REQUEST
        }
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

async fn api_locks(State(served): State<Arc<Served>>, Query(query): Query<ListQuery>) -> Response {
    if let Some(message) = bad_prefix(&query.prefix) {
        return error(StatusCode::BAD_REQUEST, message);
    }
    let prefix = effective_prefix(&served.prefix, &query.prefix);
    // The served prefix's listing, narrowed here: every request shares one scan.
    let listing = match served.listing.get(&served.locks, &served.prefix).await {
        Ok(listing) => listing,
        Err(e) => return error(status_of(&e), e.to_string()),
    };
    let locks: Vec<_> = match prefix {
        Some(prefix) => listing
            .locks
            .iter()
            .filter(|info| info.name.starts_with(prefix))
            .map(to_json)
            .collect(),
        None => Vec::new(),
    };
    secured(
        Json(json!({
            "store": served.store,
            "backend": served.locks.info().name,
            "prefix": prefix.unwrap_or(&query.prefix),
            "allow_break": served.break_token.is_some(),
            "truncated": listing.truncated,
            "locks": locks,
        }))
        .into_response(),
    )
}

#[derive(Debug, serde::Deserialize)]
struct BreakRequest {
    name: String,
}

/// Compares without stopping at the first difference, so the time taken does not tell how
/// much of a guess was right.
fn same_token(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn api_break(
    State(served): State<Arc<Served>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Some(expected) = &served.break_token else {
        return error(
            StatusCode::FORBIDDEN,
            "breaking locks is off: start dlock serve with --allow-break",
        );
    };
    let given = headers
        .get(TOKEN_HEADER)
        .map(HeaderValue::as_bytes)
        .unwrap_or_default();
    if !same_token(given, expected.0.as_bytes()) {
        return error(StatusCode::FORBIDDEN, "wrong or missing break token");
    }
    let request: BreakRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the body must be {{\"name\": \"…\"}}: {e}"),
            );
        }
    };
    if effective_prefix(&served.prefix, &request.name) != Some(request.name.as_str()) {
        return error(
            StatusCode::FORBIDDEN,
            "that lock is outside the prefix this server shows",
        );
    }
    let released = served.locks.force_release(&request.name).await;
    served.listing.forget().await;
    match released {
        Ok(broken) => {
            tracing::warn!(name = %shown(&request.name), broken, "lock broken from dlock serve");
            secured(Json(json!({ "name": request.name, "broken": broken })).into_response())
        }
        Err(e) => error(status_of(&e), e.to_string()),
    }
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The per-lock series and totals of one scrape, rendered by a recorder of its own: each
/// scrape shows exactly the locks held now (a released lock's series are gone, not stale).
fn render_locks(served: &Served, listed: &Listed) -> String {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let backend = served.locks.info().name;
    metrics::with_local_recorder(&recorder, || {
        use metrics::{describe_gauge, gauge};
        describe_gauge!(
            "dlock_store_up",
            "1 when the store answered the listing of this scrape, 0 when it failed"
        );
        describe_gauge!(
            "dlock_store_list_seconds",
            "How long the store listing this scrape shows took"
        );
        gauge!("dlock_store_up", "backend" => backend).set(if listed.is_ok() { 1.0 } else { 0.0 });
        let Ok(listing) = listed else {
            return;
        };
        describe_gauge!(
            "dlock_store_list_truncated",
            "1 when the listing stopped at --max-locks with more locks left, else 0"
        );
        gauge!("dlock_store_list_seconds", "backend" => backend).set(seconds(listing.took));
        gauge!("dlock_store_list_truncated", "backend" => backend).set(if listing.truncated {
            1.0
        } else {
            0.0
        });
        let held = &listing.locks;
        describe_gauge!("dlock_store_locks_held", "Locks held in the store, by kind");
        describe_gauge!(
            "dlock_store_waiters",
            "Requests waiting for the held locks, summed over the locks whose store counts them"
        );
        describe_gauge!("dlock_lock_held", "1 for each held lock, by name and kind");
        describe_gauge!(
            "dlock_lock_holder",
            "1 for each held lock, with its holder's label, host and pid"
        );
        describe_gauge!(
            "dlock_lock_ttl_seconds",
            "Lease time left of a held lock (absent for session locks)"
        );
        describe_gauge!(
            "dlock_lock_age_seconds",
            "How long the current holder has held the lock"
        );
        describe_gauge!("dlock_lock_fence", "The fencing token of the current hold");
        describe_gauge!(
            "dlock_lock_holds",
            "The hold count of the lock (above 1 for reentrant holds)"
        );
        describe_gauge!(
            "dlock_lock_waiters",
            "Requests waiting for the lock, where the store counts them"
        );
        let now = SystemTime::now();
        let mut by_kind = std::collections::BTreeMap::<&'static str, f64>::new();
        let mut waiters = 0.0;
        for info in held {
            let name = info.name.clone();
            let kind = info.kind.as_str();
            *by_kind.entry(kind).or_default() += 1.0;
            gauge!("dlock_lock_held", "name" => name.clone(), "kind" => kind).set(1.0);
            gauge!(
                "dlock_lock_holder",
                "name" => name.clone(),
                "label" => info.owner.label.clone().unwrap_or_default(),
                "host" => info.owner.host.clone(),
                "pid" => info.owner.pid.to_string()
            )
            .set(1.0);
            if let Some(ttl) = info.ttl_left {
                gauge!("dlock_lock_ttl_seconds", "name" => name.clone()).set(seconds(ttl));
            }
            let age = now.duration_since(info.acquired_at).unwrap_or_default();
            gauge!("dlock_lock_age_seconds", "name" => name.clone()).set(seconds(age));
            // Exact as an f64 up to 2^53; fences above that (clock-floored ones) lose their
            // last digits here, never in the JSON.
            #[allow(clippy::cast_precision_loss)]
            gauge!("dlock_lock_fence", "name" => name.clone()).set(info.fence.get() as f64);
            gauge!("dlock_lock_holds", "name" => name.clone()).set(f64::from(info.holds));
            if let Some(count) = info.waiters {
                waiters += f64::from(count);
                gauge!("dlock_lock_waiters", "name" => name).set(f64::from(count));
            }
        }
        for kind in [
            dlock::HoldKind::Mutex,
            dlock::HoldKind::Reader,
            dlock::HoldKind::Writer,
            dlock::HoldKind::Permit,
        ] {
            let count = by_kind.get(kind.as_str()).copied().unwrap_or(0.0);
            gauge!("dlock_store_locks_held", "backend" => backend, "kind" => kind.as_str())
                .set(count);
        }
        gauge!("dlock_store_waiters", "backend" => backend).set(waiters);
    });
    handle.render()
}

async fn metrics(State(served): State<Arc<Served>>) -> Response {
    let listed = served.listing.get(&served.locks, &served.prefix).await;
    if let Err(e) = &listed {
        tracing::warn!(error = %e, "listing the store for /metrics failed");
    }
    let mut body = render_locks(&served, &listed);
    if let Some(library) = &served.library {
        body.push_str(&library.render());
    }
    secured(
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            body,
        )
            .into_response(),
    )
}

#[cfg(test)]
mod tests {
    use super::{AllowedHosts, effective_prefix, same_token};

    #[test]
    fn only_the_names_the_server_is_reached_by_are_allowed_hosts() {
        let loopback = AllowedHosts::new("127.0.0.1:9477".parse().unwrap(), &[]).unwrap();
        for host in [
            "127.0.0.1:9477",
            "127.0.0.1",
            "localhost",
            "LocalHost:9477",
            "[::1]:9477",
            "[::1]",
        ] {
            assert!(loopback.allows(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:9477",
            "localhost:80",
            "",
            "127.0.0.2",
        ] {
            assert!(!loopback.allows(host), "{host}");
        }
        let given = [
            "locks.internal".to_owned(),
            "10.0.0.5:80".to_owned(),
            "::2".to_owned(),
        ];
        let wide = AllowedHosts::new("0.0.0.0:9477".parse().unwrap(), &given).unwrap();
        for host in [
            "locks.internal",
            "Locks.Internal:9477",
            "10.0.0.5:80",
            "[::2]:9477",
        ] {
            assert!(wide.allows(host), "{host}");
        }
        for host in ["localhost", "10.0.0.5", "10.0.0.5:9477", "other.internal"] {
            assert!(!wide.allows(host), "{host}");
        }
        for bad in ["", "a b", "user@host", "host/path", "host:port"] {
            let error = AllowedHosts::new("127.0.0.1:1".parse().unwrap(), &[bad.to_owned()]);
            assert!(error.is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn a_request_narrows_the_served_prefix_and_never_widens_it() {
        assert_eq!(effective_prefix("", "jobs/"), Some("jobs/"));
        assert_eq!(effective_prefix("jobs/", "jobs/a"), Some("jobs/a"));
        assert_eq!(effective_prefix("jobs/", ""), Some("jobs/"));
        assert_eq!(effective_prefix("jobs/", "users/"), None);
    }

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(same_token(b"abc", b"abc"));
        assert!(!same_token(b"abc", b"abd"));
        assert!(!same_token(b"ab", b"abc"));
        assert!(!same_token(b"", b"abc"));
    }
}
