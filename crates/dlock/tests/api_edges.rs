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
