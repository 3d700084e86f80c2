#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! What dlock logs when a lock is lost: the lock's name, its store, its fence and why, as an
//! operator reads it; never the internals of a lease (connections, file handles, watchers).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_lost_lock_is_logged_by_name_backend_fence_and_reason() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let locks = dlock::connect("memory://logs-test").await.unwrap();
    let guard = locks
        .mutex("jobs/nightly")
        .ttl(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the keeper never signalled the loss");

    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let line = text
        .lines()
        .find(|line| line.contains("lock lost"))
        .unwrap_or_else(|| panic!("no loss logged: {text}"));
    for field in [
        "lock=jobs/nightly",
        "backend=memory",
        "fence=1",
        "late_ms=",
        "ran out",
    ] {
        assert!(line.contains(field), "{field} missing from: {line}");
    }
    // One short line, without the lease's Debug dump.
    assert!(
        !line.contains('{') && !line.contains("Lease"),
        "internals logged: {line}"
    );
    assert!(line.len() < 300, "a {}-byte log line: {line}", line.len());
}
