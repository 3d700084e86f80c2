//! The blocking facade: the same names without async, for scripts and threads.
//!
//! `cargo run -p dlock-rs --example blocking`

use std::time::Duration;

fn main() -> dlock::Result<()> {
    let url = format!(
        "sqlite://{}",
        std::env::temp_dir().join("dlock-example.db").display()
    );
    let locks = dlock::blocking::Locks::connect(&url)?;
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let locks = locks.clone();
            std::thread::spawn(move || -> dlock::Result<u64> {
                // No TTL: the watchdog renews the lease while the guard lives.
                let guard = locks
                    .mutex("examples/counter")
                    .wait(Duration::from_secs(10))
                    .acquire()?;
                println!(
                    "worker {worker} holds the lock with fence {}",
                    guard.fence()
                );
                std::thread::sleep(Duration::from_millis(50));
                let fence = guard.fence().get();
                guard.release()?;
                Ok(fence)
            })
        })
        .collect();
    for worker in workers {
        match worker.join() {
            Ok(result) => {
                result?;
            }
            Err(_) => eprintln!("a worker thread panicked"),
        }
    }
    Ok(())
}
