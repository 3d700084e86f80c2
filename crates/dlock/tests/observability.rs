#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! What the library tells an operator, on a real SQLite store: the metrics it records through
//! the `metrics` facade (read back as Prometheus text) and the reasons guards give for a loss.
//! The tracing spans are checked in `spans.rs`.

use std::future::Future;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

/// Runs `test` on a current-thread runtime (the keeper's task included) with `recorder` as the
/// recorder of this thread.
fn recorded<F: Future<Output = ()>>(recorder: &PrometheusRecorder, test: F) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(recorder, || runtime.block_on(test));
}

/// The value of the sample of `metric` whose labels include every `labels` pair.
fn sample(text: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(metric)?;
        let (inside, value) = rest.strip_prefix('{')?.rsplit_once("} ")?;
        labels
            .iter()
            .all(|(name, value)| inside.contains(&format!("{name}=\"{value}\"")))
            .then(|| value.trim().parse().ok())?
    })
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("locks.db").display())
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}");
}

#[test]
fn acquire_outcomes_waiting_held_and_hold_time_are_recorded() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let sqlite = [("backend", "sqlite")];
    recorded(&recorder, async {
        let a = dlock::connect(&url).await.unwrap();
        let b = dlock::connect(&url).await.unwrap();
        let held = a.mutex("m").acquire().await.unwrap();
        assert_eq!(sample(&handle.render(), "dlock_held", &sqlite), Some(1.0));
        assert!(b.mutex("m").try_acquire().await.unwrap().is_none());
        let timed_out = b
            .mutex("m")
            .wait(Duration::from_millis(50))
            .acquire()
            .await
            .unwrap_err();
        assert!(matches!(timed_out, dlock::Error::Timeout { .. }));

        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.mutex("m").acquire().await }
        });
        until("a waiter in dlock_waiting", || {
            sample(&handle.render(), "dlock_waiting", &sqlite) == Some(1.0)
        })
        .await;
        held.release().await.unwrap();
        let second = waiter.await.unwrap().unwrap();
        let text = handle.render();
        assert_eq!(sample(&text, "dlock_waiting", &sqlite), Some(0.0), "{text}");
        assert_eq!(sample(&text, "dlock_held", &sqlite), Some(1.0), "{text}");
        second.release().await.unwrap();

        let text = handle.render();
        let count = |outcome: &str| {
            sample(
                &text,
                "dlock_acquire_seconds_count",
                &[("backend", "sqlite"), ("outcome", outcome)],
            )
        };
        assert_eq!(count("acquired"), Some(2.0), "{text}");
        assert_eq!(count("busy"), Some(1.0), "{text}");
        assert_eq!(count("timed_out"), Some(1.0), "{text}");
        // Only calls that could wait are in the wait time: the waiter and the timed-out one.
        assert_eq!(
            sample(
                &text,
                "dlock_wait_seconds_count",
                &[("backend", "sqlite"), ("outcome", "acquired")]
            ),
            Some(2.0),
            "{text}"
        );
        assert_eq!(sample(&text, "dlock_held", &sqlite), Some(0.0), "{text}");
        assert_eq!(
            sample(&text, "dlock_hold_seconds_count", &sqlite),
            Some(2.0),
            "{text}"
        );
    });
}

#[test]
fn a_loss_says_why_and_is_counted_by_reason() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    recorded(&recorder, async {
        let locks = dlock::connect(&url)
            .await
            .unwrap()
            .with_watchdog_lease(Duration::from_millis(300))
            .unwrap();
        let other = dlock::connect(&url).await.unwrap();

        // A fixed TTL that nobody extends runs out.
        let fixed = locks
            .mutex("fixed")
            .ttl(Duration::from_millis(100))
            .acquire()
            .await
            .unwrap();
        assert_eq!(fixed.lost_reason(), None);
        fixed.lost().await;
        assert_eq!(fixed.lost_reason(), Some(dlock::LostReason::Expired));

        // A watchdog lease broken by another client: its next renewal is refused.
        let renewed = locks.mutex("renewed").acquire().await.unwrap();
        assert!(other.force_release("renewed").await.unwrap());
        renewed.lost().await;
        assert_eq!(
            renewed.lost_reason(),
            Some(dlock::LostReason::RenewalRefused)
        );

        let text = handle.render();
        let lost = |reason: &str| {
            sample(
                &text,
                "dlock_lost_total",
                &[("backend", "sqlite"), ("reason", reason)],
            )
        };
        assert_eq!(lost("expired"), Some(1.0), "{text}");
        assert_eq!(lost("renewal_refused"), Some(1.0), "{text}");
        // Lost holds are no longer counted as held.
        assert_eq!(
            sample(&text, "dlock_held", &[("backend", "sqlite")]),
            Some(0.0),
            "{text}"
        );
    });
}
