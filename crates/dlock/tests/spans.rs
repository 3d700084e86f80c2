#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! The tracing spans of acquire, extend and release, on a real SQLite store. A test binary of
//! its own: tracing caches per call site whether anyone listens, and a test on another thread
//! hitting the same call sites with no subscriber could race that cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("locks.db").display())
}

/// One closed span: its name and its fields as text.
type SpanRecord = (String, HashMap<String, String>);

/// Collects every span's fields, given at creation or recorded later, as text.
#[derive(Clone, Default)]
struct Spans {
    open: Arc<Mutex<HashMap<u64, SpanRecord>>>,
    closed: Arc<Mutex<Vec<SpanRecord>>>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").replace('"', ""),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.open
            .lock()
            .unwrap()
            .insert(id.into_u64(), (attrs.metadata().name().to_owned(), fields));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some((_, fields)) = self.open.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }
    fn on_close(&self, id: Id, _: Context<'_, S>) {
        if let Some(span) = self.open.lock().unwrap().remove(&id.into_u64()) {
            self.closed.lock().unwrap().push(span);
        }
    }
}

#[test]
fn acquire_extend_and_release_have_spans_with_name_backend_fence_and_outcome() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fence = tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let locks = dlock::connect(&url).await.unwrap();
            let other = dlock::connect(&url).await.unwrap();
            let guard = locks.mutex("spanned").acquire().await.unwrap();
            assert!(
                other
                    .mutex("spanned")
                    .try_acquire()
                    .await
                    .unwrap()
                    .is_none()
            );
            guard.extend(Duration::from_secs(60)).await.unwrap();
            let fence = guard.fence().get();
            guard.release().await.unwrap();
            fence
        })
    });
    let closed = spans.closed.lock().unwrap().clone();
    let find = |name: &str, outcome: &str| {
        closed
            .iter()
            .find(|(n, f)| n == name && f.get("outcome").map(String::as_str) == Some(outcome))
            .map(|(_, f)| f.clone())
            .unwrap_or_else(|| panic!("no {name} span with outcome {outcome}: {closed:?}"))
    };
    let fence = fence.to_string();
    for (name, outcome) in [
        ("dlock.acquire", "acquired"),
        ("dlock.extend", "ok"),
        ("dlock.release", "ok"),
    ] {
        let fields = find(name, outcome);
        assert_eq!(fields["lock"], "spanned", "{name}: {fields:?}");
        assert_eq!(fields["backend"], "sqlite", "{name}: {fields:?}");
        assert_eq!(fields["fence"], fence, "{name}: {fields:?}");
    }
    let busy = find("dlock.acquire", "busy");
    assert!(!busy.contains_key("fence"), "{busy:?}");
}

#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[test]
fn native_semaphores_and_rwlocks_have_acquire_spans_with_their_kind() {
    let redis =
        dlock_testkit::require::present("redis", dlock_testkit::fixture::RedisFixture::start())
            .unwrap();
    let url = dlock_testkit::fixture::Fixture::url(redis.as_ref()).unwrap();
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fences = tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let locks = dlock::connect(&url).await.unwrap();
            let permit = locks.semaphore("quota", 2).acquire().await.unwrap();
            let read = locks.rwlock("table").read().await.unwrap();
            let fences = [permit.fence().get(), read.fence().get()];
            read.release().await.unwrap();
            let write = locks.rwlock("table").write().await.unwrap();
            let fences = [fences[0], fences[1], write.fence().get()];
            permit.release().await.unwrap();
            write.release().await.unwrap();
            fences
        })
    });
    let closed = spans.closed.lock().unwrap().clone();
    for ((lock, kind), fence) in [
        ("quota", "permit"),
        ("table", "reader"),
        ("table", "writer"),
    ]
    .into_iter()
    .zip(fences)
    {
        let fields = closed
            .iter()
            .find(|(n, f)| n == "dlock.acquire" && f.get("kind").map(String::as_str) == Some(kind))
            .map(|(_, f)| f.clone())
            .unwrap_or_else(|| panic!("no {kind} acquire span: {closed:?}"));
        assert_eq!(fields["lock"], lock, "{fields:?}");
        assert_eq!(fields["backend"], "redis", "{fields:?}");
        assert_eq!(fields["outcome"], "acquired", "{fields:?}");
        assert_eq!(fields["fence"], fence.to_string(), "{fields:?}");
    }
}

/// Re-entries and a multi-lock's one-step attempt go through the same observed path as every
/// other hold: each has its `dlock.acquire` span.
#[test]
fn a_reentry_and_a_multi_locks_one_step_attempt_have_acquire_spans() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (reentry_fence, multi_fence) = tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            // In-process memory: a store with reentrant locks.
            let memory = dlock::connect("memory://spans-reentry").await.unwrap();
            let outer = memory.mutex("ledger").reentrant().acquire().await.unwrap();
            let inner = outer.reenter().await.unwrap();
            let reentry_fence = inner.fence().get();
            inner.release().await.unwrap();
            outer.release().await.unwrap();
            // SQLite takes every lock of a multi-lock in one transaction.
            let sqlite = dlock::connect(&url).await.unwrap();
            let both = sqlite.multi_lock(["b", "a"]).try_acquire().await.unwrap();
            let both = both.expect("both locks are free");
            let multi_fence = both.fences().map(|(_, fence)| fence.get()).max().unwrap();
            both.release().await.unwrap();
            (reentry_fence, multi_fence)
        })
    });
    let closed = spans.closed.lock().unwrap().clone();
    let acquired = |lock: &str| {
        closed
            .iter()
            .filter(|(n, f)| {
                n == "dlock.acquire"
                    && f.get("lock").map(String::as_str) == Some(lock)
                    && f.get("outcome").map(String::as_str) == Some("acquired")
            })
            .map(|(_, f)| f.clone())
            .collect::<Vec<_>>()
    };
    let ledger = acquired("ledger");
    assert_eq!(ledger.len(), 2, "the hold and its re-entry: {closed:?}");
    for fields in &ledger {
        assert_eq!(fields["fence"], reentry_fence.to_string(), "{fields:?}");
        assert_eq!(fields["kind"], "mutex", "{fields:?}");
    }
    let one_step = acquired("a,b");
    assert_eq!(one_step.len(), 1, "one span for the one step: {closed:?}");
    assert_eq!(one_step[0]["backend"], "sqlite");
    assert_eq!(one_step[0]["fence"], multi_fence.to_string());
    assert!(
        acquired("a").is_empty() && acquired("b").is_empty(),
        "the one step took both: {closed:?}"
    );
}
