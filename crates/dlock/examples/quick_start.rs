//! Take a lock on the embedded default, use its fence, watch for loss, release.
//!
//! `cargo run -p dlock-rs --example quick_start [sqlite:///path/locks.db]`

use std::time::Duration;

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::args().nth(1).unwrap_or_else(|| {
        format!(
            "sqlite://{}",
            std::env::temp_dir().join("dlock-example.db").display()
        )
    });
    let locks = dlock::connect(&url)
        .await?
        .with_label("quick-start example")?;

    let guard = locks
        .mutex("examples/report")
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(5))
        .acquire()
        .await?;
    println!("acquired {} with fence {}", guard.name(), guard.fence());

    if let Some(info) = locks.inspect("examples/report").await? {
        println!(
            "held by {} for another {:?}",
            info.owner,
            info.ttl_left.unwrap_or_default()
        );
    }

    tokio::select! {
        () = guard.lost() => eprintln!("lost the lock: stop touching the resource"),
        () = tokio::time::sleep(Duration::from_millis(200)) => println!("work done under fence {}", guard.fence()),
    }
    guard.release().await?;
    println!("released");
    Ok(())
}
