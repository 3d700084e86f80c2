//! The read-after-write workload of the replicated stores: one client takes a lock and
//! another inspects it at once, many pairs side by side, so that a reader served by a replica
//! that has not applied the grant yet shows up as a lock read as free.

use std::time::Duration;

/// Of `tasks × rounds` locks, how many another client inspected as free right after one
/// client took them (each task its own pair of clients of `url`, its own names).
///
/// # Errors
///
/// A connect, an acquire, an inspection or a release failed.
///
/// # Examples
///
/// ```no_run
/// # async fn f() -> anyhow::Result<()> {
/// let stale = dlock_testkit::read_after_write::read_as_free("zk://127.0.0.1:2181/t", 16, 64).await?;
/// assert_eq!(stale, 0);
/// # Ok(()) }
/// ```
pub async fn read_as_free(url: &str, tasks: usize, rounds: usize) -> anyhow::Result<usize> {
    let mut running = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let (taker, reader) = (dlock::connect(url).await?, dlock::connect(url).await?);
        running.spawn(async move {
            let mut stale = 0;
            for round in 0..rounds {
                let name = format!("read-after-write/{task}/{round}");
                let guard = taker
                    .mutex(&name)
                    .ttl(Duration::from_secs(60))
                    .acquire()
                    .await?;
                if reader.inspect(&name).await?.is_none() {
                    stale += 1;
                }
                guard.release().await?;
            }
            anyhow::Ok(stale)
        });
    }
    let mut stale = 0;
    for done in running.join_all().await {
        stale += done?;
    }
    Ok(stale)
}
