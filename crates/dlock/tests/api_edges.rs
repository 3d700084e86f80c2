#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! Small API promises a new user relies on: builders are `Clone`, and the library names the
//! CLI's embedded default store.

use std::time::Duration;

#[tokio::test]
async fn a_builder_is_clone_and_each_clone_acquires_on_its_own() {
    let locks = dlock::connect("memory://api-edges-clone").await.unwrap();
    let builder = locks.mutex("jobs/a").ttl(Duration::from_secs(5)).no_wait();
    let first = builder.clone().acquire().await.unwrap();
    assert!(builder.clone().try_acquire().await.unwrap().is_none());
    first.release().await.unwrap();
    builder.acquire().await.unwrap().release().await.unwrap();

    let permits = locks.semaphore("pool", 1);
    let held = permits.clone().acquire().await.unwrap();
    assert!(permits.try_acquire().await.unwrap().is_none());
    held.release().await.unwrap();
    let reading = locks.rwlock("table");
    let _r = reading.clone().read().await.unwrap();
    assert!(reading.try_write().await.unwrap().is_none());
    let both = locks.multi_lock(["x", "y"]);
    let _b = both.clone().acquire().await.unwrap();
    assert!(both.try_acquire().await.unwrap().is_none());
}

#[cfg(feature = "sqlite")]
#[test]
fn default_url_is_a_sqlite_file_created_on_first_use() {
    let url = dlock::default_url();
    assert!(url.starts_with("sqlite://"), "{url}");
    assert!(url.ends_with("dlock/locks.db?create_dirs=true"), "{url}");
}

#[tokio::test]
async fn the_lost_token_and_the_list_stream_are_named_by_dlock() {
    let locks = dlock::connect("memory://api-edges-names").await.unwrap();
    let guard = locks.mutex("a").acquire().await.unwrap();
    let lost: dlock::CancellationToken = guard.lost_token();
    let listed: dlock::LockStream = locks.list("");
    use futures::TryStreamExt;
    assert_eq!(listed.try_collect::<Vec<_>>().await.unwrap().len(), 1);
    guard.release().await.unwrap();
    assert!(lost.is_cancelled());
}

#[cfg(feature = "blocking")]
#[tokio::test]
async fn the_blocking_facade_inside_a_runtime_says_what_to_do_instead() {
    let error = dlock::blocking::Locks::connect("memory://api-edges-blocking").unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("cannot run inside an async runtime")
            && message.contains("spawn_blocking"),
        "{message}"
    );
}
