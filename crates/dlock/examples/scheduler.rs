//! Periodic jobs run by several workers: each job runs exactly once per period, whichever
//! worker gets there first. The job's lock keeps workers from running it at the same time; its
//! "last period" value, written with compare-and-set, makes the run happen once even if a lock
//! is lost mid-run. (`dlock demo scheduler` runs the same over many OS processes.)
//!
//! `cargo run -p dlock-rs --example scheduler [URL]` (default: a SQLite file in the temp dir)

use std::time::Duration;

const WORKERS: u32 = 4;
const JOBS: u32 = 5;
const PERIODS: u32 = 3;
const PERIOD: Duration = Duration::from_millis(500);

async fn worker(locks: dlock::Locks, run: String, id: u32) -> anyhow::Result<()> {
    let mut ticks = tokio::time::interval(PERIOD);
    for period in 0..PERIODS {
        ticks.tick().await;
        for job in 0..JOBS {
            let lock = locks.mutex(format!("{run}/job-{job}")).ttl(PERIOD);
            let Some(guard) = lock.try_acquire().await? else {
                continue; // another worker has it
            };
            let last = locks.value(format!("{run}/job-{job}/last-period"));
            let seen = last.get().await?;
            let due = match &seen {
                Some(v) => String::from_utf8_lossy(&v.value).parse::<u32>()? < period,
                None => true,
            };
            if due {
                let claimed = last
                    .compare_and_set(seen.map(|v| v.version), period.to_string())
                    .await?;
                if claimed.is_some() {
                    println!(
                        "period {period}: job {job} ran on worker {id} (fence {})",
                        guard.fence()
                    );
                }
            }
            guard.release().await?;
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args().nth(1).unwrap_or_else(|| {
        let path = std::env::temp_dir().join("dlock-example.db");
        format!("sqlite://{}", path.display())
    });
    let locks = dlock::connect(&url).await?;
    let run = format!("scheduler/{}", uuid::Uuid::new_v4().simple());
    let workers: Vec<_> = (0..WORKERS)
        .map(|id| tokio::spawn(worker(locks.clone(), run.clone(), id)))
        .collect();
    for worker in workers {
        worker.await??;
    }
    Ok(())
}
