//! Cross-process cases, driven through the real `dlock` CLI as lock taker.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};

use crate::cli::{Holder, dlock_binary};

use super::primitive::{CLI, Primitive};
use super::{Ctx, Needs, cases};

cases!["process",
    // The other process is the `dlock` CLI: the primitives it can take (it has no flag for a
    // read-write lock's write side).
    Needs::CrossProcess, CLI =>
        mutual_exclusion_across_processes,
        lock_held_by_another_process_is_busy,
        killed_holder_process_is_recovered_within_its_lease,
        holder_process_releases_on_exit;
    Needs::CrossProcess =>
        permits_are_counted_across_processes,
        killed_permit_holder_process_returns_its_permit
];

async fn mutual_exclusion_across_processes(cx: Ctx) -> anyhow::Result<()> {
    const PROCESSES: usize = 4;
    let rounds = cx.rounds(10, 4);
    let url = cx.url()?;
    let name = cx.name("counter");
    cx.pre_take(&name).await?;
    let args = cx.primitive().cli_args().join(" ");
    let dir = tempfile::tempdir()?;
    let counter = dir.path().join("counter");
    std::fs::write(&counter, "0")?;
    let dlock = dlock_binary()?;
    // Read, pause, write back: any overlap of two holders loses an update.
    let increment = format!(
        "n=$(cat '{c}'); sleep 0.01; echo $((n + 1)) > '{c}'",
        c = counter.display()
    );
    let script = format!(
        "for i in $(seq {rounds}); do '{bin}' --url \"$URL\" run $ARGS --wait 60s \"$NAME\" -- sh -c \"$STEP\" || exit 1; done",
        bin = dlock.display()
    );
    let outcome = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let children: Vec<_> = (0..PROCESSES)
            .map(|_| {
                Command::new("sh")
                    .arg("-c")
                    .arg(&script)
                    .env("URL", &url)
                    .env("NAME", &name)
                    .env("ARGS", &args)
                    .env("STEP", &increment)
                    .stderr(std::process::Stdio::piped())
                    .spawn()
            })
            .collect::<Result<_, _>>()?;
        // Every loop is waited for (and its stderr read) before any failure is reported, so
        // the report says what dlock printed.
        let outputs: Vec<_> = children
            .into_iter()
            .map(|child| child.wait_with_output())
            .collect::<Result<_, _>>()?;
        for output in outputs {
            ensure!(
                output.status.success(),
                "a dlock run loop failed: {}; it printed: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    })
    .await?;
    outcome?;
    let total: usize = std::fs::read_to_string(&counter)?.trim().parse()?;
    ensure!(
        total == PROCESSES * rounds,
        "lost updates: counter is {total}, expected {}",
        PROCESSES * rounds
    );
    Ok(())
}

async fn lock_held_by_another_process_is_busy(cx: Ctx) -> anyhow::Result<()> {
    let url = cx.url()?;
    let name = cx.name("held");
    cx.pre_take(&name).await?;
    let args = cx.primitive().cli_args();
    let holder = tokio::task::spawn_blocking({
        let (url, name, args) = (url.clone(), name.clone(), args.clone());
        move || Holder::start(&url, &name, &strs(&args))
    })
    .await??;
    let locks = cx.locks().await?;
    ensure!(
        cx.lock(&locks, &name).try_acquire().await?.is_none(),
        "got a lock held by another process"
    );
    // What `inspect` shows of a semaphore's name is the mutex area's business.
    if locks.info().capabilities.monitor && cx.primitive() == Primitive::Mutex {
        let info = locks
            .inspect(&name)
            .await?
            .context("held lock not inspected")?;
        ensure!(
            info.owner.pid == holder.child.id(),
            "owner pid {} vs {}",
            info.owner.pid,
            holder.child.id()
        );
        ensure!(info.fence.get() == holder.fence);
    }
    let busy = tokio::task::spawn_blocking({
        let (url, name) = (url.clone(), name.clone());
        move || {
            crate::cli::dlock_command(&url)?
                .arg("run")
                .args(&args)
                .args(["--no-wait", &name, "--", "true"])
                .status()
                .context("dlock run")
        }
    })
    .await??;
    ensure!(
        busy.code() == Some(75),
        "dlock run --no-wait on a held lock exited {busy}"
    );
    let code = tokio::task::spawn_blocking(move || holder.finish()).await??;
    ensure!(code == 0, "dlock hold exited {code}");
    Ok(())
}

async fn killed_holder_process_is_recovered_within_its_lease(cx: Ctx) -> anyhow::Result<()> {
    let url = cx.url()?;
    let name = cx.name("abandoned");
    cx.pre_take(&name).await?;
    let mut args = cx.primitive().cli_args();
    args.extend(["--ttl".into(), "1s".into()]);
    let mut holder = tokio::task::spawn_blocking({
        let name = name.clone();
        move || Holder::start(&url, &name, &strs(&args))
    })
    .await??;
    holder.kill()?;
    let locks = cx.locks().await?;
    let start = std::time::Instant::now();
    let next = cx
        .lock(&locks, &name)
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    ensure!(
        start.elapsed() < Duration::from_secs(5),
        "recovery took {:?}",
        start.elapsed()
    );
    ensure!(
        next.fence().get() > holder.fence,
        "fence did not increase after the takeover"
    );
    next.release().await?;
    Ok(())
}

async fn holder_process_releases_on_exit(cx: Ctx) -> anyhow::Result<()> {
    let url = cx.url()?;
    let name = cx.name("released");
    cx.pre_take(&name).await?;
    let mut args = cx.primitive().cli_args();
    args.extend(["--ttl".into(), "600s".into()]);
    let holder = tokio::task::spawn_blocking({
        let name = name.clone();
        move || Holder::start(&url, &name, &strs(&args))
    })
    .await??;
    let code = tokio::task::spawn_blocking(move || holder.finish()).await??;
    ensure!(code == 0, "dlock hold exited {code}");
    let locks = cx.locks().await?;
    ensure!(
        cx.lock(&locks, &name).try_acquire().await?.is_some(),
        "lock still held after the holder exited"
    );
    Ok(())
}

async fn permits_are_counted_across_processes(cx: Ctx) -> anyhow::Result<()> {
    let url = cx.url()?;
    let name = cx.name("permits");
    let start = |url: String, name: String| {
        tokio::task::spawn_blocking(move || Holder::start(&url, &name, &["--permits", "2"]))
    };
    let first = start(url.clone(), name.clone()).await??;
    let second = start(url.clone(), name.clone()).await??;
    let busy = tokio::task::spawn_blocking({
        let (url, name) = (url.clone(), name.clone());
        move || {
            crate::cli::dlock_command(&url)?
                .args(["run", "--permits", "2", "--no-wait", &name, "--", "true"])
                .status()
                .context("dlock run")
        }
    })
    .await??;
    ensure!(
        busy.code() == Some(75),
        "a third of two permits: exit {busy}"
    );
    let locks = cx.locks().await?;
    ensure!(
        locks.semaphore(&name, 2).try_acquire().await?.is_none(),
        "this process got a third of two permits"
    );
    ensure!(tokio::task::spawn_blocking(move || first.finish()).await?? == 0);
    ensure!(
        locks.semaphore(&name, 2).try_acquire().await?.is_some(),
        "a returned permit was not free"
    );
    ensure!(tokio::task::spawn_blocking(move || second.finish()).await?? == 0);
    Ok(())
}

async fn killed_permit_holder_process_returns_its_permit(cx: Ctx) -> anyhow::Result<()> {
    let url = cx.url()?;
    let name = cx.name("crashed-permit");
    let mut holder = tokio::task::spawn_blocking({
        let name = name.clone();
        move || Holder::start(&url, &name, &["--permits", "1", "--ttl", "1s"])
    })
    .await??;
    let locks = cx.locks().await?;
    ensure!(
        locks.semaphore(&name, 1).try_acquire().await?.is_none(),
        "the only permit is free while its holder lives"
    );
    holder.kill()?;
    let start = std::time::Instant::now();
    let permit = locks
        .semaphore(&name, 1)
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    ensure!(
        start.elapsed() < Duration::from_secs(5),
        "the permit came back after {:?}",
        start.elapsed()
    );
    permit.release().await?;
    Ok(())
}

/// The `&str`s of owned arguments, for [`Holder::start`].
fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}
