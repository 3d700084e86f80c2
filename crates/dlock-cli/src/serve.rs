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
//! store URL is shown redacted.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
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

    /// Only locks whose names start with this (requests can narrow it further, not widen it).
    #[arg(long, default_value = "")]
    prefix: String,

    /// Let the page break locks: each break asks for confirmation and the break token.
    #[arg(long)]
    allow_break: bool,

    /// The token a break must present (with --allow-break). Without it, a random one is made
    /// and printed on stderr at start.
    #[arg(
        long,
        env = "DLOCK_BREAK_TOKEN",
        hide_env_values = true,
        requires = "allow_break"
    )]
    break_token: Option<String>,
}

#[derive(Debug)]
struct Served {
    locks: dlock::Locks,
    /// The store URL with every credential replaced, as shown on the page and in the JSON.
    store: String,
    prefix: String,
    /// `Some` when breaking is allowed.
    break_token: Option<String>,
    /// What the library recorded in this process through the `metrics` facade.
    library: Option<PrometheusHandle>,
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
    let break_token = args.allow_break.then(|| {
        args.break_token.clone().unwrap_or_else(|| {
            let token = uuid::Uuid::new_v4().simple().to_string();
            eprintln!("dlock serve: break token {token}");
            token
        })
    });
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
    if !addr.ip().is_loopback() {
        eprintln!(
            "dlock serve: listening on {addr}, not loopback: anyone who reaches it sees every \
             holder"
        );
    }
    let served = Arc::new(Served {
        locks,
        store: dlock::redact_url(url),
        prefix: args.prefix,
        break_token,
        library,
    });
    let app = router(served.clone());
    // The first line of stdout says where to go (and which port, when asked for port 0).
    println!("serving http://{addr}/ (store {})", shown(&served.store));
    let shutdown = async move {
        signals.recv().await;
    };
    match axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        Ok(()) => 0,
        Err(e) => fail(&e.into()),
    }
}

fn router(served: Arc<Served>) -> axum::Router {
    axum::Router::new()
        .route("/", get(page))
        .route("/page.js", get(script))
        .route("/metrics", get(metrics))
        .route("/api/locks", get(api_locks))
        .route("/api/break", post(api_break))
        .with_state(served)
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

/// Held locks under `prefix`, sorted by name, a composed primitive as one entry.
async fn held(served: &Served, prefix: Option<&str>) -> dlock::Result<Vec<dlock::LockInfo>> {
    let Some(prefix) = prefix else {
        return Ok(Vec::new());
    };
    let held: Vec<dlock::LockInfo> = served.locks.list(prefix).try_collect().await?;
    Ok(crate::composed::fold(held))
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
    let prefix = effective_prefix(&served.prefix, &query.prefix);
    match held(&served, prefix).await {
        Ok(held) => secured(
            Json(json!({
                "store": served.store,
                "backend": served.locks.info().name,
                "prefix": prefix.unwrap_or(&query.prefix),
                "allow_break": served.break_token.is_some(),
                "locks": held.iter().map(to_json).collect::<Vec<_>>(),
            }))
            .into_response(),
        ),
        Err(e) => error(status_of(&e), e.to_string()),
    }
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
    if !same_token(given, expected.as_bytes()) {
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
    match served.locks.force_release(&request.name).await {
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
fn render_locks(
    served: &Served,
    listed: &dlock::Result<Vec<dlock::LockInfo>>,
    took: Duration,
) -> String {
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
            "How long listing the store's locks took in this scrape"
        );
        gauge!("dlock_store_up", "backend" => backend).set(if listed.is_ok() { 1.0 } else { 0.0 });
        gauge!("dlock_store_list_seconds", "backend" => backend).set(seconds(took));
        let Ok(held) = listed else {
            return;
        };
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
    let started = Instant::now();
    let listed = held(&served, Some(&served.prefix)).await;
    if let Err(e) = &listed {
        tracing::warn!(error = %e, "listing the store for /metrics failed");
    }
    let mut body = render_locks(&served, &listed, started.elapsed());
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
    use super::{effective_prefix, same_token};

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
