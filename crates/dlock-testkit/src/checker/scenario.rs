//! One run of the safety workload under one fault: worker processes contend for one lock and
//! write through the checker service while the fault happens; the result is a
//! [`ScenarioReport`] with the figures RELIABILITY.md quotes.

use std::fmt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::service::{Acquisitions, CheckerService};
use super::worker::{self, WORKER_ENV, WorkerConfig};
use super::{CheckReport, FencedResource};

/// How the workers behave.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Worker processes.
    pub workers: usize,
    /// The lease of every hold.
    pub ttl: Duration,
    /// How long each hold lasts.
    pub hold: Duration,
    /// How long each acquire may wait.
    pub wait: Duration,
    /// Whether the resource refuses stale writes (`false`: the canary).
    pub fenced: bool,
    /// Holds before the fault, so it strikes a running workload.
    pub holds_before: usize,
    /// Holds after the fault ends that count as recovered.
    pub holds_after: usize,
    /// Deadline of every wait of the run (generous: it only stops a hung run).
    pub deadline: Duration,
    /// How long after the workers end the lock may still be held (the lease, or for session
    /// stores the session timeout, of a killed holder).
    pub release_within: Duration,
    /// Workers are threads of this process (the memory backend) rather than processes.
    pub in_process: bool,
    /// Holds use the watchdog (a lease of `ttl`, renewed while held) instead of a fixed TTL.
    pub watchdog: bool,
}

impl Default for Workload {
    fn default() -> Workload {
        Workload {
            workers: 3,
            ttl: Duration::from_secs(1),
            hold: Duration::from_millis(40),
            wait: Duration::from_secs(10),
            fenced: true,
            holds_before: 3,
            holds_after: 3,
            deadline: Duration::from_secs(60),
            release_within: Duration::from_secs(10),
            in_process: false,
            watchdog: false,
        }
    }
}

/// A fault to inject once the workload runs.
pub enum Fault {
    /// None: the baseline.
    None,
    /// SIGKILL of the worker holding the lock.
    HolderKill,
    /// SIGSTOP of a worker right after it acquired, SIGCONT after this long (past its TTL).
    HolderPause(Duration),
    /// A fault done by the caller (server kill, restart or pause, a proxy fault, a leader
    /// kill): the closure injects it and returns once it is over.
    External(&'static str, Box<dyn FnOnce() -> anyhow::Result<()> + Send>),
}

impl Fault {
    /// A short name for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::HolderKill => "holder SIGKILL",
            Fault::HolderPause(_) => "holder SIGSTOP past TTL",
            Fault::External(name, _) => name,
        }
    }
}

impl fmt::Debug for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one run found.
#[derive(Clone, Debug)]
pub struct ScenarioReport {
    /// The fault's name.
    pub fault: &'static str,
    /// Whether the resource refused stale writes.
    pub fenced: bool,
    /// The workers' acquisitions.
    pub acquisitions: Acquisitions,
    /// The checker's findings.
    pub check: CheckReport,
    /// Overlaps of holds whose earlier holder was not told, outside the fault (from its
    /// start to one lease after its end, the time a holder may need to hear of a loss the
    /// fault caused): violations of mutual exclusion.
    pub overlaps_without_fault: usize,
    /// Overlaps during the fault whose earlier holder was not (yet) told: the fault let a
    /// second holder in (a store that lost its data); the fence must cover them.
    pub overlaps_during_fault: usize,
    /// Stale writes refused whose holder's guard never reported the lock lost (must be 0).
    pub stale_writes_unsignalled: usize,
    /// The largest delay between a hold's real loss and its lost signal, frozen holders aside
    /// (`None`: no signal came after the loss; the keeper signals before the store's lease
    /// ends).
    pub lost_lag_max: Option<Duration>,
    /// Holds open when the fault began, and how many of those were reported lost.
    pub holds_struck: (usize, usize),
    /// The longest time from the fault's start to the lost signal of a hold it struck.
    pub lost_after_fault_max: Option<Duration>,
    /// For a holder pause: whether the paused holder's guard reported the loss, and how long
    /// after it was continued.
    pub paused_holder_lost: Option<Option<Duration>>,
    /// For a holder pause: holds by other workers that started while it was frozen.
    pub holds_during_pause: usize,
    /// From the end of the fault to the first hold after it.
    pub recovery: Option<Duration>,
    /// The fault's duration.
    pub fault_duration: Duration,
    /// A lock still held `release_within` after the workers ended.
    pub leftover: Option<String>,
    /// Workers that failed, hung or exited with an error (other than the one killed).
    pub worker_failures: Vec<String>,
    /// The first indeterminate acquire errors.
    pub errors: Vec<String>,
    /// The whole run.
    pub elapsed: Duration,
}

impl ScenarioReport {
    /// What must hold after every fault: no unsignalled overlap, no stale write from a holder
    /// that was not told, recovery, no lock left behind, no failed worker.
    pub fn violations(&self) -> Vec<String> {
        let mut violations = Vec::new();
        if self.overlaps_without_fault > 0 {
            violations.push(format!(
                "{} overlapping holds with no fault active and no lost signal: {:?}",
                self.overlaps_without_fault, self.check.overlaps
            ));
        }
        if !self.check.fence_regressions.is_empty() {
            violations.push(format!(
                "fences did not grow (highest so far, then the next): {:?}",
                self.check.fence_regressions
            ));
        }
        if self.stale_writes_unsignalled > 0 {
            violations.push(format!(
                "{} stale writes by holders never told of the loss",
                self.stale_writes_unsignalled
            ));
        }
        if self.recovery.is_none() {
            violations.push("no hold after the fault ended".into());
        }
        if let Some(leftover) = &self.leftover {
            violations.push(format!("lock left behind: {leftover}"));
        }
        if !self.worker_failures.is_empty() {
            violations.push(format!("workers failed: {:?}", self.worker_failures));
        }
        violations
    }

    /// One line of figures.
    pub fn summary(&self) -> String {
        let a = self.acquisitions;
        let ms = |d: Option<Duration>| d.map_or("-".into(), |d| format!("{}", d.as_millis()));
        format!(
            "{fault} ({fenced}): acquisitions {att} attempted / {ok} ok / {to} timed out / {ind} indeterminate; \
             holds {holds}; overlaps {ov} unsignalled outside the fault, {ovd} unsignalled during it, {lov} after a lost signal; fence regressions {reg}; writes {acc} accepted / {rej} stale refused / {unsafe_} unsafe accepted; \
             lost signals {lost}, max lag {lag} ms{paused}; holds struck by the fault {struck} ({struck_lost} told lost, the last {after} ms after it began); recovery {rec} ms after a {dur} ms fault; leftover {left}; {secs:.1} s",
            fault = self.fault,
            fenced = if self.fenced {
                "fenced"
            } else {
                "unfenced canary"
            },
            att = a.attempted,
            ok = a.succeeded,
            to = a.timed_out,
            ind = a.indeterminate,
            holds = self.check.holds,
            ov = self.overlaps_without_fault,
            ovd = self.overlaps_during_fault,
            reg = self.check.fence_regressions.len(),
            lov = self.check.lost_overlaps.len(),
            acc = self.check.accepted,
            rej = self.check.rejected.len(),
            unsafe_ = self.check.unsafe_writes,
            lost = self.check.lost_holds,
            lag = ms(self.lost_lag_max),
            paused = match self.paused_holder_lost {
                None => String::new(),
                Some(None) => format!(
                    "; paused holder NOT told ({} holds meanwhile)",
                    self.holds_during_pause
                ),
                Some(Some(lag)) => format!(
                    "; paused holder told {} ms after SIGCONT ({} holds meanwhile)",
                    lag.as_millis(),
                    self.holds_during_pause
                ),
            },
            struck = self.holds_struck.0,
            struck_lost = self.holds_struck.1,
            after = ms(self.lost_after_fault_max),
            rec = ms(self.recovery),
            dur = self.fault_duration.as_millis(),
            left = self.leftover.as_deref().unwrap_or("none"),
            secs = self.elapsed.as_secs_f64(),
        )
    }
}

enum Workers {
    Processes(Vec<Child>),
    Threads(Vec<std::thread::JoinHandle<anyhow::Result<()>>>),
}

/// Runs `workload` on the lock `name` of the store at `url` (what the workers use; it may go
/// through a [`FaultProxy`](crate::fault_proxy::FaultProxy)) under `fault`, then checks with a
/// client of `direct_url` that no lock was left behind.
///
/// # Errors
///
/// The service or the workers could not start, the workload never got going, or the fault
/// could not be injected. A run that went wrong in a way the checker measures is not an
/// error: see [`ScenarioReport::violations`].
pub fn run(
    url: &str,
    direct_url: &str,
    name: &str,
    workload: &Workload,
    fault: Fault,
) -> anyhow::Result<ScenarioReport> {
    let started = Instant::now();
    let resource = if workload.fenced {
        FencedResource::new()
    } else {
        FencedResource::unfenced()
    };
    let service = CheckerService::start(resource)?;
    let config = WorkerConfig {
        url: url.to_owned(),
        name: name.to_owned(),
        checker: service.addr(),
        ttl: workload.ttl,
        hold: workload.hold,
        wait: workload.wait,
        watchdog: workload.watchdog,
        id: 0,
    };
    let mut workers = spawn_workers(&config, workload)?;
    let fault_name = fault.name();
    let outcome = drive(&service, &mut workers, workload, fault);
    // Whatever happened, let the workers finish before reading the record.
    service.stop_workers();
    let worker_failures = reap(workers, workload.deadline);
    let (fault_start, fault_end, paused) = outcome.map_err(|error| {
        let holder = leftover(direct_url, name, Duration::ZERO);
        error.context(format!(
            "{:?}; first indeterminate errors: {:?}; workers: {worker_failures:?}; the lock: {holder:?}",
            service.acquisitions(),
            service.errors()
        ))
    })?;

    let resource = service.resource();
    let check = resource.report();
    let fault_active = |at: Instant| at >= fault_start && at <= fault_end + workload.ttl;
    let (overlaps_during_fault, overlaps_without_fault) = check
        .overlap_details
        .iter()
        .filter(|overlap| !overlap.signalled)
        .fold((0, 0), |(during, without), overlap| {
            if fault_active(overlap.at) {
                (during + 1, without)
            } else {
                (during, without + 1)
            }
        });
    let stale_writes_unsignalled = check
        .rejected
        .iter()
        .filter(|stale| resource.lost_at(stale.fence).is_none())
        .count();
    // A frozen holder cannot hear anything until it runs again: its lag is reported apart.
    let frozen = paused.map(|pause| pause.fence);
    let lost_lag_max = resource
        .lost_lags(workload.ttl)
        .into_iter()
        .filter(|(fence, _)| Some(*fence) != frozen)
        .filter_map(|(_, lag)| lag)
        .max();
    let (paused_holder_lost, holds_during_pause) = match paused {
        Some(pause) => {
            let continued = pause.continued.unwrap_or(fault_end);
            let lost = resource
                .lost_at(pause.fence)
                .map(|at| at.saturating_duration_since(continued));
            let during = resource
                .holds_since(pause.stopped)
                .into_iter()
                .filter(|&start| start < continued)
                .count();
            (Some(lost), during)
        }
        None => (None, 0),
    };
    let struck = resource.holds_open_at(fault_start);
    let holds_struck = (
        struck.len(),
        struck.iter().filter(|(_, lost)| lost.is_some()).count(),
    );
    let lost_after_fault_max = struck
        .iter()
        .filter_map(|(_, lost)| lost.map(|at| at.saturating_duration_since(fault_start)))
        .max();
    let recovery = resource
        .holds_since(fault_end)
        .into_iter()
        .min()
        .map(|first| first - fault_end);
    let leftover = leftover(direct_url, name, workload.release_within)?;
    Ok(ScenarioReport {
        fault: fault_name,
        fenced: workload.fenced,
        acquisitions: service.acquisitions(),
        check,
        overlaps_without_fault,
        overlaps_during_fault,
        stale_writes_unsignalled,
        lost_lag_max,
        paused_holder_lost,
        holds_during_pause,
        holds_struck,
        lost_after_fault_max,
        recovery,
        fault_duration: fault_end - fault_start,
        leftover,
        worker_failures,
        errors: service.errors(),
        elapsed: started.elapsed(),
    })
}

fn spawn_workers(config: &WorkerConfig, workload: &Workload) -> anyhow::Result<Workers> {
    if workload.in_process {
        let threads = (0..workload.workers)
            .map(|i| {
                let config = WorkerConfig {
                    id: u32::try_from(i).unwrap_or(u32::MAX),
                    ..config.clone()
                };
                std::thread::spawn(move || {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?
                        .block_on(worker::run(config))
                })
            })
            .collect();
        return Ok(Workers::Threads(threads));
    }
    let exe = std::env::current_exe().context("current_exe")?;
    let mut children = Vec::new();
    for _ in 0..workload.workers {
        children.push(
            Command::new(&exe)
                .args(config.args())
                .env(WORKER_ENV, "1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                // With `DLOCK_LOG` set, the workers' logs go to the test's stderr.
                .stderr(if std::env::var_os("DLOCK_LOG").is_some() {
                    Stdio::inherit()
                } else {
                    Stdio::piped()
                })
                .spawn()
                .context("spawn a safety worker")?,
        );
    }
    Ok(Workers::Processes(children))
}

type FaultWindow = (Instant, Instant, Option<super::service::Pause>);

fn drive(
    service: &CheckerService,
    workers: &mut Workers,
    workload: &Workload,
    fault: Fault,
) -> anyhow::Result<FaultWindow> {
    let deadline = workload.deadline;
    wait_until(deadline, "the workload to start", || {
        service.acquisitions().succeeded >= workload.holds_before
    })?;
    let (start, end, paused) = match fault {
        Fault::None => {
            let now = Instant::now();
            (now, now, None)
        }
        Fault::HolderKill => {
            let Workers::Processes(children) = workers else {
                bail!("a holder kill needs worker processes");
            };
            let mut victim = None;
            wait_until(deadline, "a holder to kill", || {
                victim = service.resource().current_holder();
                victim.is_some()
            })?;
            let Some((fence, Some(pid))) = victim else {
                bail!("the holder has no pid");
            };
            let child = children
                .iter_mut()
                .find(|child| child.id() == pid)
                .context("the holder is not one of the workers")?;
            child.kill()?;
            let killed = Instant::now();
            child.wait()?;
            // The process can no longer touch anything: its hold ends here.
            service.resource().end_hold(fence);
            (killed, killed, None)
        }
        Fault::HolderPause(pause) => {
            service.pause_next_holder(pause);
            let mut done = None;
            wait_until(
                deadline + pause,
                "the paused holder to be continued",
                || {
                    done = service
                        .pauses()
                        .first()
                        .copied()
                        .filter(|p| p.continued.is_some());
                    done.is_some()
                },
            )?;
            let Some(pause) = done else {
                bail!("no pause");
            };
            (
                pause.stopped,
                pause.continued.unwrap_or(pause.stopped),
                Some(pause),
            )
        }
        Fault::External(name, inject) => {
            // Strike while a lock is held, where a fault can do harm.
            wait_until(deadline, "a hold to strike", || {
                service.resource().current_holder().is_some()
            })?;
            let start = Instant::now();
            inject().with_context(|| format!("inject {name}"))?;
            (start, Instant::now(), None)
        }
    };
    wait_until(deadline, "holds after the fault", || {
        service.resource().holds_since(end).len() >= workload.holds_after
    })?;
    Ok((start, end, paused))
}

fn wait_until(
    deadline: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let until = Instant::now() + deadline;
    while !done() {
        if Instant::now() > until {
            bail!("gave up waiting for {what} after {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

fn reap(workers: Workers, deadline: Duration) -> Vec<String> {
    let mut failures = Vec::new();
    match workers {
        Workers::Processes(children) => {
            let until = Instant::now() + deadline;
            for mut child in children {
                let status = loop {
                    match child.try_wait() {
                        Ok(Some(status)) => break Some(status),
                        Ok(None) if Instant::now() < until => {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        _ => break None,
                    }
                };
                let mut stderr = String::new();
                match status {
                    // The holder the fault killed.
                    Some(status) if status.code().is_none() => {}
                    Some(status) if status.success() => {}
                    Some(status) => {
                        if let Some(mut pipe) = child.stderr.take() {
                            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
                        }
                        failures.push(format!("worker {} {status}: {}", child.id(), stderr.trim()));
                    }
                    None => {
                        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
                        let _ = kill(pid, Signal::SIGCONT);
                        let _ = child.kill();
                        let _ = child.wait();
                        failures.push(format!("worker {} hung and was killed", child.id()));
                    }
                }
            }
        }
        Workers::Threads(threads) => {
            for thread in threads {
                match thread.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => failures.push(format!("worker thread: {error:#}")),
                    Err(_) => failures.push("worker thread panicked".into()),
                }
            }
        }
    }
    failures
}

/// The lock, if a client of `url` still sees it held after `within`: by `inspect`, or where
/// the store has no inspection (Redlock) by trying to take it.
fn leftover(url: &str, name: &str, within: Duration) -> anyhow::Result<Option<String>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let locks = dlock::connect(url).await?;
        let until = Instant::now() + within;
        loop {
            let held = match locks.inspect(name).await {
                Ok(info) => {
                    info.map(|info| format!("held by {} (fence {})", info.owner, info.fence.get()))
                }
                Err(dlock::Error::Unsupported { .. }) => {
                    match locks
                        .mutex(name)
                        .ttl(Duration::from_secs(1))
                        .try_acquire()
                        .await
                    {
                        Ok(Some(guard)) => {
                            guard.release().await?;
                            None
                        }
                        Ok(None) => Some("held (a probe could not take it)".to_owned()),
                        Err(error) if error.is_retryable() => Some(error.to_string()),
                        Err(error) => return Err(error.into()),
                    }
                }
                Err(error) if error.is_retryable() => Some(error.to_string()),
                Err(error) => return Err(error.into()),
            };
            match held {
                None => return Ok(None),
                Some(held) if Instant::now() > until => return Ok(Some(format!("{name} {held}"))),
                Some(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
}
