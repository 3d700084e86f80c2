//! A one-shot job, as cron or a systemd timer runs it: connect, take the job's lock, do the
//! work, end. There is no explicit release: the guard still alive when `main` returns is
//! released while `#[tokio::main]` shuts its runtime down, so the lock is free the moment the
//! process ends and the next run (or another machine's) gets it at once, not after the lease.
//!
//! If another run still holds the lock, this one skips its turn instead of queueing.
//!
//! `DLOCK_URL=redis://127.0.0.1:6379 cargo run -p dlock-rs --example cron_job`
//! (without `DLOCK_URL`: a SQLite file in the temp directory).

/// The job (public so `tests/exit.rs` can run this very program as a child process).
#[tokio::main]
pub async fn main() -> dlock::Result<()> {
    let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| {
        format!(
            "sqlite://{}",
            std::env::temp_dir().join("dlock-example.db").display()
        )
    });
    let locks = dlock::connect(&url).await?.with_label("nightly report")?;

    let Some(job) = locks.mutex("jobs/nightly-report").try_acquire().await? else {
        println!("another run holds jobs/nightly-report: skipping this one");
        return Ok(());
    };
    println!("running the nightly report under fence {}", job.fence());
    // The work. A long job would watch `job.lost()` and stop writing when it fires.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    println!("done");
    Ok(())
    // `job` is dropped here and released before the process exits.
}
