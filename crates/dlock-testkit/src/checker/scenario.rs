//! One run of the safety workload under one fault: worker processes contend for one lock and
//! write through the checker service while the fault happens; the result is a
//! [`ScenarioReport`] with the figures RELIABILITY.md quotes.

use std::fmt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::canary::Canary;
use super::election::{ObserveFindings, Observer, judge_observations};
use super::service::{Acquisitions, CheckerService};
use super::worker::{self, Primitive, WORKER_ENV, WorkerConfig};
use super::{CheckReport, FencedResource, Hold, HoldKind, Overlap, SIGNAL_TOLERANCE};

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
    /// What the workers take.
    pub primitive: Primitive,
    /// The promise the workers' store breaks (a canary run), if any.
    pub canary: Canary,
    /// Writes per hold.
    pub writes: u32,
    /// One URL per worker (each through its own proxy, so one worker can be cut off alone);
    /// empty: every worker uses the run's URL.
    pub worker_urls: Vec<String>,
    /// The fault can lose the store's data (a restart of Redis without persistence, a
    /// minority of Redlock's nodes restarted empty): only then is an unsignalled overlap or
    /// stale write during the fault left to the fence. Never on SQL, etcd, ZooKeeper, SQLite.
    pub fault_loses_data: bool,
    /// The fault cuts the holder it strikes off from the store for longer than a lease
    /// (server killed or frozen, blackhole, partition): that holder must be told within one
    /// lease (plus [`SIGNAL_TOLERANCE`]) of the fault's start if its hold lasts that long.
    pub fault_cuts_off: bool,
    /// The fault ends in the store the lease of every hold it strikes (a Redis or every
    /// Redlock node without persistence killed or restarted, a restart from an older snapshot,
    /// a failover to a lagging replica, a session lock's server restarted or its connections
    /// reset): each such hold must be told within one lease (plus [`SIGNAL_TOLERANCE`]) of
    /// the strike if its hold lasts that long, whether or not anyone else got in.
    pub fault_ends_leases: bool,
    /// Stop after this many acquisitions instead of after the fault (the soak).
    pub acquisitions: Option<usize>,
    /// The fault ends the holds it strikes in the store at once, and their holders can only
    /// learn of it at their next check, at most this long after the strike (a session lock
    /// whose connection alone was ended checks it every `check_interval`): an unsignalled
    /// overlap with such a hold is the documented window, counted apart, as long as its
    /// holder was told within this bound (plus [`SIGNAL_TOLERANCE`]) of the strike.
    pub fault_told_within: Option<Duration>,
    /// With [`Primitive::Election`]: an observer follows the election from this process (see
    /// [`super::election`]), and a term it shows longer than this after the term ended is
    /// stale (the store's lease: the TTL, or a session timeout).
    pub observe_lease: Option<Duration>,
    /// Every this many rounds a worker holds for half a lease, two leases or three in turn
    /// instead of [`hold`](Self::hold) (0: never): with the watchdog, holds renewed mid-hold
    /// (the renewal soak).
    pub long_every: u32,
    /// A store or network fault strikes a hold that has been held this long (one of the long
    /// holds, with renewals still to come) rather than one that just began.
    pub strike_held_for: Option<Duration>,
    /// The renewal rule applies (the soak): a watchdog hold the fault did not strike must
    /// never be lost, however long it is held.
    pub renewal_rule: bool,
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
            primitive: Primitive::Mutex,
            canary: Canary::None,
            writes: 4,
            worker_urls: Vec::new(),
            fault_loses_data: false,
            fault_cuts_off: false,
            fault_ends_leases: false,
            acquisitions: None,
            fault_told_within: None,
            observe_lease: None,
            long_every: 0,
            strike_held_for: None,
            renewal_rule: false,
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
    /// The worker holding the lock is cut off from the store for this long while the others
    /// go on: the closure cuts (`true`) or heals (`false`) the network of the worker with
    /// that index (its own proxy, see [`Workload::worker_urls`]).
    Partition(
        Duration,
        Box<dyn Fn(usize, bool) -> anyhow::Result<()> + Send>,
    ),
    /// A fault that brings back an older state of the store. The run takes the lock itself
    /// and, with every worker cut off (`cut(true)`), releases it and lets `checkpoint` save
    /// the store's state (a snapshot, a replica cut off), so the saved state holds the lock
    /// free with its last fence, as a release leaves it; then the workers go on for `after`,
    /// and `lose` brings the saved state back (a restart from the snapshot, a failover to the
    /// replica). A store that continued its fences from that older state would hand out
    /// fences already given.
    PartialLoss {
        /// For reports.
        name: &'static str,
        /// Cuts every worker off from the store (`true`) or lets them through (`false`).
        cut: Box<dyn Fn(bool) -> anyhow::Result<()> + Send>,
        /// Saves the state to come back.
        checkpoint: Box<dyn FnOnce() -> anyhow::Result<()> + Send>,
        /// How long the workers go on between the checkpoint and the loss.
        after: Duration,
        /// Brings the saved state back.
        lose: Box<dyn FnOnce() -> anyhow::Result<()> + Send>,
    },
}

impl Fault {
    /// A short name for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::HolderKill => "holder SIGKILL",
            Fault::HolderPause(_) => "holder SIGSTOP past TTL",
            Fault::External(name, _) => name,
            Fault::Partition(..) => "holder partitioned",
            Fault::PartialLoss { name, .. } => name,
        }
    }
}

impl fmt::Debug for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The name the frozen-holder rule's violations start with (the caller adds the one for a
/// frozen lease holder never told, which only it knows to be a violation).
pub const FROZEN_HOLDER_RULE: &str = "frozen-holder rule";

/// The frozen-holder rule's violation, if any: a frozen holder must be told at once (within
/// [`SIGNAL_TOLERANCE`]) when it runs again, and when `must_lose` (its lock was a lease,
/// which the freeze outlived) it must be told at all. `told` is
/// [`ScenarioReport::paused_holder_lost`].
pub fn frozen_holder_rule(told: Option<Option<Duration>>, must_lose: bool) -> Option<String> {
    match told? {
        Some(lag) if lag > SIGNAL_TOLERANCE => Some(format!(
            "{FROZEN_HOLDER_RULE}: the frozen holder was told {} ms after it ran again (at once is {} ms)",
            lag.as_millis(),
            SIGNAL_TOLERANCE.as_millis()
        )),
        None if must_lose => Some(format!(
            "{FROZEN_HOLDER_RULE}: the frozen holder's guard never reported the loss"
        )),
        _ => None,
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
    /// Overlaps of holds whose earlier holder had not been told when the later began (within
    /// [`SIGNAL_TOLERANCE`]), except those a data-losing fault may cause (from its start to
    /// one lease after its end) and those of a frozen holder while it was frozen (it cannot
    /// hear; the fence covers it): violations of mutual exclusion.
    pub overlaps_without_fault: usize,
    /// The first of those (earlier fence, later fence).
    pub unsignalled_overlaps: Vec<(dlock::FencingToken, dlock::FencingToken)>,
    /// Overlaps during a data-losing fault whose earlier holder was not (yet) told: the fault
    /// let a second holder in (a store that lost its data); the fence must cover them.
    pub overlaps_during_fault: usize,
    /// Stale writes refused whose holder's guard had not reported the lock lost when it
    /// wrote (within [`SIGNAL_TOLERANCE`]), a data-losing fault's window aside (must be 0).
    pub stale_writes_unsignalled: usize,
    /// Every lost signal's lag, frozen holders aside: from the moment the hold became doubtful
    /// (its start for a fixed TTL, the fault's strike for a hold the fault struck) to the
    /// signal.
    pub lost_lags: Vec<Duration>,
    /// The largest of [`lost_lags`](Self::lost_lags).
    pub lost_lag_max: Option<Duration>,
    /// Holds told too late or never, although their lease had surely ended (a fixed TTL run
    /// out, a fault that cut them off for longer than a lease or ended their lease in the
    /// store, or another holder let in while they held): violations.
    pub late_signals: Vec<String>,
    /// Holds open when the fault struck (a multi-lock's once), and how many of those were
    /// reported lost.
    pub holds_struck: (usize, usize),
    /// The longest time from the fault's strike to the lost signal of a hold it struck.
    pub lost_after_fault_max: Option<Duration>,
    /// For a holder pause: whether the paused holder's guard reported the loss, and how long
    /// after it was continued.
    pub paused_holder_lost: Option<Option<Duration>>,
    /// For a holder pause: holds by other workers that started while it was frozen.
    pub holds_during_pause: usize,
    /// Holds (a multi-lock's once) that lasted longer than their lease: with the watchdog,
    /// holds renewed while held.
    pub held_past_lease: usize,
    /// Under the renewal rule ([`Workload::renewal_rule`]), watchdog holds told lost that the
    /// fault did not strike: violations.
    pub renewals_lost: Vec<String>,
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
    /// What the election observer's items showed ([`Workload::observe_lease`]), if one ran.
    pub observed: Option<ObserveFindings>,
    /// The whole run.
    pub elapsed: Duration,
}

impl ScenarioReport {
    /// What must hold after every fault: no unsignalled overlap (outside a data-losing
    /// fault), no fence regression, no stale write from a holder not yet told, no stale write
    /// accepted, no late lost signal, recovery, no lock left behind, no failed worker.
    pub fn violations(&self) -> Vec<String> {
        let mut violations = Vec::new();
        if self.overlaps_without_fault > 0 {
            violations.push(format!(
                "overlap rule: {} overlapping holds whose earlier holder had not been told when the later began (first ones: {:?})",
                self.overlaps_without_fault, self.unsignalled_overlaps
            ));
        }
        if !self.check.fence_regressions.is_empty() {
            violations.push(format!(
                "fence rule: fences did not grow (highest so far, then the next): {:?}",
                self.check.fence_regressions
            ));
        }
        if self.stale_writes_unsignalled > 0 {
            violations.push(format!(
                "stale-write rule: {} stale writes by holders not yet told of the loss: {:?}",
                self.stale_writes_unsignalled, self.check.stale_unsignalled
            ));
        }
        if self.check.unsafe_writes > 0 {
            violations.push(format!(
                "unsafe-write rule: {} stale writes accepted by an unfenced resource (lost updates)",
                self.check.unsafe_writes
            ));
        }
        if !self.late_signals.is_empty() {
            violations.push(format!(
                "lag rule: lost signals later than one lease + {} ms: {:?}",
                SIGNAL_TOLERANCE.as_millis(),
                self.late_signals
            ));
        }
        if !self.renewals_lost.is_empty() {
            violations.push(format!(
                "renewal rule: {} watchdog holds no fault struck were lost: {:?}",
                self.renewals_lost.len(),
                self.renewals_lost
            ));
        }
        if let Some(observed) = &self.observed {
            violations.extend(observed.violations());
        }
        violations.extend(frozen_holder_rule(self.paused_holder_lost, false));
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

    /// The run's figures, for the report RELIABILITY.md's tables are made from
    /// (`scripts/reliability_figures.py`).
    pub fn figures(&self) -> serde_json::Value {
        let ms = |d: Option<Duration>| d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let a = self.acquisitions;
        serde_json::json!({
            "fault": self.fault,
            "fenced": self.fenced,
            "acquisitions": {
                "attempted": a.attempted,
                "ok": a.succeeded,
                "timed_out": a.timed_out,
                "indeterminate": a.indeterminate,
            },
            "holds": self.check.holds,
            "overlaps": {
                "unsignalled": self.overlaps_without_fault,
                "during_fault": self.overlaps_during_fault,
                "after_lost_signal": self.check.lost_overlaps.len(),
            },
            "fence_regressions": self.check.fence_regressions.len(),
            "stale_writes_refused": self.check.rejected.len(),
            "unsafe_writes_accepted": self.check.unsafe_writes,
            "lost_signals": self.check.lost_holds,
            "max_lag_ms": ms(self.lost_lag_max),
            "struck": {
                "open": self.holds_struck.0,
                "told": self.holds_struck.1,
                "last_told_after_ms": ms(self.lost_after_fault_max),
            },
            "frozen_holder": match self.paused_holder_lost {
                None => serde_json::Value::Null,
                Some(told) => serde_json::json!({
                    "told_after_ms": ms(told),
                    "holds_meanwhile": self.holds_during_pause,
                }),
            },
            "recovery_ms": ms(self.recovery),
            "fault_ms": ms(Some(self.fault_duration)),
            "observer": self.observed.as_ref().map(ObserveFindings::figures),
            "seconds": self.elapsed.as_secs_f64(),
        })
    }

    /// One line of figures.
    pub fn summary(&self) -> String {
        let a = self.acquisitions;
        let ms = |d: Option<Duration>| d.map_or("-".into(), |d| format!("{}", d.as_millis()));
        format!(
            "{fault} ({fenced}): acquisitions {att} attempted / {ok} ok / {to} timed out / {ind} indeterminate; \
             holds {holds}; overlaps {ov} unsignalled outside the fault, {ovd} unsignalled during it, {lov} after a lost signal; fence regressions {reg}; writes {acc} accepted / {rej} stale refused / {unsafe_} unsafe accepted; \
             lost signals {lost}, max lag {lag} ms{paused}; holds struck by the fault {struck} ({struck_lost} told lost, the last {after} ms after it began); recovery {rec} ms after a {dur} ms fault; leftover {left}{observed}; {secs:.1} s",
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
            observed = self
                .observed
                .as_ref()
                .map_or(String::new(), ObserveFindings::summary),
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
    let resource = match workload.primitive {
        Primitive::Semaphore(permits) if native_permits(direct_url)? => {
            resource.with_permits(permits).with_ordered_permits()
        }
        Primitive::Semaphore(permits) => resource.with_permits(permits),
        _ => resource,
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
        primitive: workload.primitive,
        canary: workload.canary,
        writes: workload.writes,
        long_every: workload.long_every,
        id: 0,
    };
    let observer = workload
        .observe_lease
        .filter(|_| workload.primitive == Primitive::Election)
        .map(|_| Observer::start(direct_url, name, workload.ttl / 4, workload.canary));
    let mut workers = spawn_workers(&config, workload)?;
    let fault_name = fault.name();
    let outcome = drive(&service, &mut workers, (direct_url, name), workload, fault);
    // Whatever happened, let the workers finish before reading the record.
    service.stop_workers();
    let worker_failures = reap(workers, workload.deadline);
    let observed = observer.map(Observer::stop).transpose()?;
    let fault = outcome.map_err(|error| {
        let holder = leftover(direct_url, name, workload.primitive, Duration::ZERO);
        error.context(format!(
            "{:?}; first indeterminate errors: {:?}; workers: {worker_failures:?}; the lock: {holder:?}",
            service.acquisitions(),
            service.errors()
        ))
    })?;

    let resource = service.resource();
    let check = resource.report();
    let holds = resource.holds();
    let observed = observed
        .zip(workload.observe_lease)
        .map(|(observed, lease)| {
            judge_observations(&observed, &holds, lease, |at| fault.excuses(workload, at))
        });
    let (during, unexcused) = judge_overlaps(&check.overlap_details, &holds, workload, &fault);
    let overlaps_during_fault = during.len();
    let overlaps_without_fault = unexcused.len();
    let unsignalled_overlaps = unexcused
        .iter()
        .take(10)
        .map(|o| (o.earlier, o.later))
        .collect();
    let stale_writes_unsignalled = check
        .stale_unsignalled
        .iter()
        .filter(|stale| !fault.excuses(workload, stale.at))
        .count();
    let (lost_lags, late_signals) = signal_lags(
        &holds,
        &check.overlap_details,
        workload,
        &fault,
        Instant::now(),
    );
    let lost_lag_max = lost_lags.iter().max().copied();
    let paused = fault.paused;
    let (fault_start, fault_end) = (fault.start, fault.end);
    let (paused_holder_lost, holds_during_pause) = match paused {
        Some(pause) => {
            let continued = pause.continued.unwrap_or(fault_end);
            let lost = resource
                .lost_at(pause.fence, Some(pause.pid), pause.stopped)
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
    let struck = resource.holds_open_at(fault.strike);
    let holds_struck = (
        struck.len(),
        struck.iter().filter(|(_, lost)| lost.is_some()).count(),
    );
    let lost_after_fault_max = struck
        .iter()
        .filter_map(|(_, lost)| lost.map(|at| at.saturating_duration_since(fault.strike)))
        .max();
    let held_past_lease = holds
        .iter()
        .filter(|hold| {
            hold.part == 0 && hold.end.is_some_and(|end| end - hold.start > workload.ttl)
        })
        .count();
    let renewals_lost = renewals_lost(&holds, workload, &fault);
    let recovery = resource
        .holds_since(fault_end)
        .into_iter()
        .min()
        .map(|first| first - fault_end);
    let leftover = leftover(
        direct_url,
        name,
        workload.primitive,
        workload.release_within,
    )?;
    Ok(ScenarioReport {
        fault: fault_name,
        fenced: workload.fenced,
        acquisitions: service.acquisitions(),
        check,
        overlaps_without_fault,
        unsignalled_overlaps,
        overlaps_during_fault,
        stale_writes_unsignalled,
        lost_lags,
        lost_lag_max,
        late_signals,
        paused_holder_lost,
        holds_during_pause,
        holds_struck,
        lost_after_fault_max,
        held_past_lease,
        renewals_lost,
        recovery,
        fault_duration: fault_end - fault_start,
        leftover,
        worker_failures,
        errors: service.errors(),
        observed,
        elapsed: started.elapsed(),
    })
}

/// When the fault of a run happened, as the rules need it.
#[derive(Clone, Copy, Debug)]
pub struct FaultTimes {
    /// Its start.
    pub start: Instant,
    /// Its end (the start, for an instant fault).
    pub end: Instant,
    /// When it struck the holds' leases: its start, or for a partial loss the moment the
    /// older state was brought back.
    pub strike: Instant,
    /// Holds whose acquire began before this were not struck (a partial loss: the saved
    /// state may have them).
    pub struck_since: Option<Instant>,
    /// The holder it froze.
    pub paused: Option<super::service::Pause>,
    /// The worker a partition cut off.
    pub cut_worker: Option<u32>,
}

impl FaultTimes {
    /// A fault from `start` to `end` that struck at its start.
    pub fn new(start: Instant, end: Instant) -> FaultTimes {
        FaultTimes {
            start,
            end,
            strike: start,
            struck_since: None,
            paused: None,
            cut_worker: None,
        }
    }

    /// Whether `hold` was open when the fault struck (and granted by the store it struck).
    pub fn struck(&self, hold: &Hold) -> bool {
        hold.start <= self.strike
            && hold.end.is_none_or(|end| end > self.strike)
            && self
                .struck_since
                .is_none_or(|since| hold.attempted.is_some_and(|at| at >= since))
    }

    /// Whether an unsignalled overlap or stale write at `at` is left to the fence: a fault
    /// that can lose the store's data may let a second holder in before the first can know,
    /// from its start to one lease after its end (the time a holder may need to hear of it).
    pub fn excuses(&self, workload: &Workload, at: Instant) -> bool {
        workload.fault_loses_data && at >= self.start && at <= self.end + workload.ttl
    }

    /// The group of the frozen holder's hold ([`Hold::group`]): its worker's hold open when it
    /// was stopped.
    fn frozen_group(&self, holds: &[Hold]) -> Option<u64> {
        let pause = self.paused?;
        holds
            .iter()
            .find(|hold| {
                hold.worker == Some(pause.pid)
                    && hold.fence == pause.fence
                    && hold.start <= pause.stopped
                    && hold.end.is_none_or(|end| end > pause.stopped)
            })
            .map(|hold| hold.group)
    }
}

/// The unsignalled overlaps of a run, split into those a data-losing fault excuses (left to
/// the fence) and the violations. An overlap that began while the earlier holder was frozen
/// is the fence's to cover too: it cannot hear anything until it runs again (and must be told
/// at once then, which the frozen-holder rule checks); so is a permit beyond the count while
/// a permit holder is frozen, when the frozen permit accounts for it
/// ([`frozen_permit_explains`]).
pub fn judge_overlaps(
    overlaps: &[Overlap],
    holds: &[Hold],
    workload: &Workload,
    fault: &FaultTimes,
) -> (Vec<Overlap>, Vec<Overlap>) {
    let frozen = fault.frozen_group(holds);
    let while_frozen = |overlap: &Overlap| match fault.paused {
        Some(pause) if overlap.at <= pause.continued.unwrap_or(fault.end) + SIGNAL_TOLERANCE => {
            Some(overlap.earlier_group) == frozen
                || frozen_permit_explains(overlap, holds, workload.primitive, frozen)
        }
        _ => false,
    };
    // A struck hold told within the bound the fault allows (`fault_told_within`).
    let told_in_time = |overlap: &Overlap| {
        workload.fault_told_within.is_some_and(|bound| {
            holds.iter().any(|hold| {
                hold.group == overlap.earlier_group
                    && hold.part == overlap.part
                    && fault.struck(hold)
                    && hold
                        .lost_at
                        .is_some_and(|told| told <= fault.strike + bound + SIGNAL_TOLERANCE)
            })
        })
    };
    overlaps
        .iter()
        .copied()
        .filter(|overlap| !overlap.signalled && !while_frozen(overlap))
        .partition(|overlap| fault.excuses(workload, overlap.at) || told_in_time(overlap))
}

/// Whether a permit overlap is the frozen holder's: the resource charges a permit beyond the
/// count to the earliest untold open permit, but while a permit holder is frozen (untold, its
/// lease run out in the store) the permit the store let go is the frozen one. It is, if the
/// other untold permits open when the later one began are fewer than the count.
fn frozen_permit_explains(
    overlap: &Overlap,
    holds: &[Hold],
    primitive: Primitive,
    frozen: Option<u64>,
) -> bool {
    let Primitive::Semaphore(permits) = primitive else {
        return false;
    };
    let open_untold = |hold: &&Hold| {
        hold.kind == HoldKind::Permit
            && hold.part == overlap.part
            && hold.start < overlap.at
            && hold.end.is_none_or(|end| end > overlap.at)
            && !hold.told_by(overlap.at)
    };
    let frozen_open = holds
        .iter()
        .filter(open_untold)
        .any(|hold| Some(hold.group) == frozen);
    let others = holds
        .iter()
        .filter(open_untold)
        .filter(|hold| Some(hold.group) != frozen)
        .count();
    frozen_open && others < usize::try_from(permits).unwrap_or(usize::MAX)
}

/// Why a hold's lease must have ended, if it must: the lag rule then wants it told within
/// one lease (plus [`SIGNAL_TOLERANCE`]) of the moment it became doubtful.
fn must_be_told(
    hold: &Hold,
    overlaps: &[Overlap],
    workload: &Workload,
    fault: &FaultTimes,
) -> Option<&'static str> {
    if !workload.watchdog {
        return Some("its fixed TTL ran out");
    }
    if !fault.struck(hold) {
        return None;
    }
    // A partition cuts one worker off; a server fault, everybody.
    let cut_off = workload.fault_cuts_off
        && fault.end - fault.start > workload.ttl
        && fault.cut_worker.is_none_or(|id| hold.worker == Some(id));
    // The store let someone else in: it no longer had this hold's lease. (Not said of a
    // permit: which of the open permits the store forgot is not known.)
    let let_in = hold.kind != HoldKind::Permit
        && overlaps
            .iter()
            .any(|o| o.earlier_group == hold.group && o.part == hold.part);
    if cut_off {
        Some("the fault cut it off for longer than a lease")
    } else if workload.fault_ends_leases {
        Some("the fault ended its lease in the store")
    } else if let_in {
        Some("another holder got in while it held")
    } else {
        None
    }
}

/// Each told hold's lag, and the holds told too late (or never) although their lease had
/// surely ended. A hold becomes doubtful at its start when its TTL is fixed (the lease began
/// before the acquire returned and is never renewed), or when the fault struck it; from then
/// on it must be told within one lease plus [`SIGNAL_TOLERANCE`] if its lease must have ended
/// ([`must_be_told`]) and it was still open by then. (A later holder's start is checked more
/// strictly by the overlap rule; the frozen holder by the frozen-holder rule.)
pub fn signal_lags(
    holds: &[Hold],
    overlaps: &[Overlap],
    workload: &Workload,
    fault: &FaultTimes,
    now: Instant,
) -> (Vec<Duration>, Vec<String>) {
    let frozen = fault.frozen_group(holds);
    let mut lags = Vec::new();
    let mut late = Vec::new();
    for hold in holds {
        if Some(hold.group) == frozen {
            continue;
        }
        let doubtful = if fault.struck(hold) && fault.end > fault.start {
            fault.strike
        } else {
            hold.start
        };
        // A multi-lock's names are told at once: one lag per hold.
        if let Some(lost) = hold.lost_at.filter(|_| hold.part == 0) {
            lags.push(lost.saturating_duration_since(doubtful));
        }
        let Some(why) = must_be_told(hold, overlaps, workload, fault) else {
            continue;
        };
        let due = doubtful + workload.ttl + SIGNAL_TOLERANCE;
        if hold.end.unwrap_or(now) > due && hold.lost_at.is_none_or(|at| at > due) {
            late.push(format!(
                "fence {} ({:?} hold{}, {why}): {}",
                hold.fence,
                hold.kind,
                if hold.part > 0 {
                    format!(" on name {}", hold.part)
                } else {
                    String::new()
                },
                hold.lost_at.map_or("never told".into(), |at| format!(
                    "told {} ms after its lease",
                    at.saturating_duration_since(doubtful + workload.ttl)
                        .as_millis()
                ))
            ));
        }
    }
    (lags, late)
}

/// Under the renewal rule, the watchdog holds told lost although the fault did not strike
/// them: a hold open at the strike, begun during the fault or within a lease after it (its
/// client may still be catching up), or the frozen holder's, may be lost; any other is kept
/// by its renewals for as long as it is held.
pub fn renewals_lost(holds: &[Hold], workload: &Workload, fault: &FaultTimes) -> Vec<String> {
    if !(workload.renewal_rule && workload.watchdog) {
        return Vec::new();
    }
    let frozen = fault.frozen_group(holds);
    let struck_or_near = |hold: &Hold| {
        fault.struck(hold)
            || Some(hold.group) == frozen
            || (hold.start >= fault.start && hold.start <= fault.end + workload.ttl)
    };
    holds
        .iter()
        .filter(|hold| hold.part == 0 && hold.lost_at.is_some() && !struck_or_near(hold))
        .map(|hold| {
            format!(
                "fence {} ({:?} hold) told lost {} ms into it",
                hold.fence,
                hold.kind,
                hold.lost_at
                    .map_or(0, |at| at.saturating_duration_since(hold.start).as_millis())
            )
        })
        .collect()
}

/// Whether the store at `url` has native semaphores, whose permits' fences are ordered.
fn native_permits(url: &str) -> anyhow::Result<bool> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let locks = dlock::connect(url).await?;
        Ok(locks.backend().info().capabilities.permits)
    })
}

fn spawn_workers(config: &WorkerConfig, workload: &Workload) -> anyhow::Result<Workers> {
    if workload.in_process {
        let threads = (0..workload.workers)
            .map(|i| {
                let config = WorkerConfig {
                    id: u32::try_from(i).unwrap_or(u32::MAX),
                    url: worker_url(config, workload, i),
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
    for i in 0..workload.workers {
        let config = WorkerConfig {
            url: worker_url(config, workload, i),
            ..config.clone()
        };
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

fn worker_url(config: &WorkerConfig, workload: &Workload, i: usize) -> String {
    workload
        .worker_urls
        .get(i)
        .cloned()
        .unwrap_or_else(|| config.url.clone())
}

/// How young the hold a store fault strikes is: it then outlives the lag rule's bound (one
/// lease plus [`SIGNAL_TOLERANCE`]) when the store's holds last longer than a lease, so the
/// rule judges it (a hold ending before the bound is never judged).
const FRESH_HOLD: Duration = Duration::from_millis(20);

/// Waits until a hold has just begun (see [`FRESH_HOLD`]), or with `held_for` until a hold
/// has been held that long (within [`FRESH_HOLD`]), and returns it.
fn wait_for_a_fresh_hold(
    service: &CheckerService,
    deadline: Duration,
    held_for: Option<Duration>,
) -> anyhow::Result<Hold> {
    let mut fresh = None;
    let age = held_for.unwrap_or_default();
    wait_until(deadline, "a hold to strike", || {
        fresh = match held_for {
            None => service.resource().newest_open_hold(),
            Some(_) => service.resource().open_hold_held_for(age),
        }
        .filter(|hold| (age..age + FRESH_HOLD).contains(&hold.start.elapsed()));
        fresh.is_some()
    })?;
    fresh.context("no hold to strike")
}

fn drive(
    service: &CheckerService,
    workers: &mut Workers,
    (direct_url, name): (&str, &str),
    workload: &Workload,
    fault: Fault,
) -> anyhow::Result<FaultTimes> {
    let deadline = workload.deadline;
    wait_until(deadline, "the workload to start", || {
        service.acquisitions().succeeded >= workload.holds_before
    })?;
    let times = match fault {
        Fault::None => {
            if let Some(total) = workload.acquisitions {
                wait_until(deadline, "the acquisitions of the run", || {
                    service.acquisitions().succeeded >= total
                })?;
            }
            let now = Instant::now();
            FaultTimes::new(now, now)
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
            // The process can no longer touch anything: its hold ended with the kill. (Not
            // now: the store frees its lock as the process dies, and the next holder may have
            // begun before this thread runs again, most of all on a loaded machine.)
            service.resource().end_hold_of_at(fence, Some(pid), killed);
            FaultTimes::new(killed, killed)
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
            FaultTimes {
                paused: Some(pause),
                ..FaultTimes::new(pause.stopped, pause.continued.unwrap_or(pause.stopped))
            }
        }
        Fault::Partition(duration, cut) => {
            let holder = wait_for_a_fresh_hold(service, deadline, None)?;
            let Some(id) = holder.worker else {
                bail!("the holder has no id");
            };
            let index = match workers {
                Workers::Processes(children) => children
                    .iter()
                    .position(|child| child.id() == id)
                    .context("the holder is not one of the workers")?,
                Workers::Threads(_) => usize::try_from(id)?,
            };
            let start = Instant::now();
            cut(index, true).context("cut the holder off")?;
            std::thread::sleep(duration);
            cut(index, false).context("heal the partition")?;
            FaultTimes {
                cut_worker: Some(id),
                ..FaultTimes::new(start, Instant::now())
            }
        }
        Fault::External(name, inject) => {
            // Strike a hold that just began, where a fault can do harm.
            wait_for_a_fresh_hold(service, deadline, workload.strike_held_for)?;
            let start = Instant::now();
            inject().with_context(|| format!("inject {name}"))?;
            FaultTimes::new(start, Instant::now())
        }
        Fault::PartialLoss {
            name: fault_name,
            cut,
            checkpoint,
            after,
            lose,
        } => {
            wait_until(deadline, "a hold to strike", || {
                service.resource().current_holder().is_some()
            })?;
            let start = Instant::now();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let checkpointed = runtime
                .block_on(async {
                    let locks = dlock::connect(direct_url).await?;
                    let held =
                        worker::Held::take_exclusive(&locks, name, workload.primitive, deadline)
                            .await?;
                    cut(true)?;
                    let saved = async {
                        held.release().await?;
                        checkpoint()
                    }
                    .await;
                    let checkpointed = Instant::now();
                    cut(false)?;
                    saved.map(|()| checkpointed)
                })
                .with_context(|| format!("checkpoint before {fault_name}"))?;
            std::thread::sleep(after);
            // Every hold open now was granted after the checkpoint: the state that comes back
            // does not have it.
            let strike = Instant::now();
            lose().with_context(|| format!("inject {fault_name}"))?;
            FaultTimes {
                strike,
                struck_since: Some(checkpointed),
                ..FaultTimes::new(start, Instant::now())
            }
        }
    };
    wait_until(deadline, "holds after the fault", || {
        service.resource().holds_since(times.end).len() >= workload.holds_after
    })?;
    Ok(times)
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
/// the store has no inspection (the SQL session modes) by trying to take it.
fn leftover(
    url: &str,
    name: &str,
    primitive: Primitive,
    within: Duration,
) -> anyhow::Result<Option<String>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let locks = dlock::connect(url).await?;
        let until = Instant::now() + within;
        loop {
            let held = match primitive {
                // An election's leader holds the mutex named like it.
                Primitive::Mutex | Primitive::Election => inspect(&locks, name).await?,
                other => probe(&locks, name, other).await?,
            };
            match held {
                None => return Ok(None),
                Some(held) if Instant::now() > until => return Ok(Some(format!("{name} {held}"))),
                Some(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
}

/// Whether every part of a primitive is free: a writer, every permit, the multi-lock.
async fn probe(
    locks: &dlock::Locks,
    name: &str,
    primitive: Primitive,
) -> anyhow::Result<Option<String>> {
    // Released at once; a longer TTL only keeps a slow probe (a debug build on a loaded
    // machine opening a session connection for each part) from outliving its own lease.
    let ttl = Duration::from_secs(10);
    let taken = match primitive {
        Primitive::Mutex | Primitive::Election => return inspect(locks, name).await,
        Primitive::RwLock => match locks.rwlock(name).ttl(ttl).try_write().await {
            Ok(Some(guard)) => guard.release().await.map(|()| true),
            Ok(None) => Ok(false),
            Err(error) => Err(error),
        },
        Primitive::MultiLock => {
            match locks
                .multi_lock(Primitive::multi_names(name))
                .ttl(ttl)
                .try_acquire()
                .await
            {
                Ok(Some(guard)) => guard.release().await.map(|()| true),
                Ok(None) => Ok(false),
                Err(error) => Err(error),
            }
        }
        Primitive::Semaphore(n) => {
            let mut permits = Vec::new();
            let mut all = Ok(true);
            for _ in 0..n {
                match locks.semaphore(name, n).ttl(ttl).try_acquire().await {
                    Ok(Some(permit)) => permits.push(permit),
                    Ok(None) => all = Ok(false),
                    Err(error) => all = Err(error),
                }
            }
            for permit in permits {
                let _ = permit.release().await;
            }
            all
        }
    };
    match taken {
        Ok(true) => Ok(None),
        Ok(false) => Ok(Some(format!("{primitive:?} still held"))),
        Err(error) if error.is_retryable() => Ok(Some(error.to_string())),
        Err(error) => Err(error.into()),
    }
}

/// Whether the mutex is held, by `inspect` or where the store has no inspection (SQL sessions) by
/// trying to take it.
async fn inspect(locks: &dlock::Locks, name: &str) -> anyhow::Result<Option<String>> {
    Ok(match locks.inspect(name).await {
        Ok(info) => info.map(|info| format!("held by {} (fence {})", info.owner, info.fence.get())),
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
    })
}

#[cfg(test)]
mod tests {
    //! The rules over hand-built records: a lease of 1 s, times in ms from `t0`.

    use super::*;
    use dlock::FencingToken;

    struct Record {
        t0: Instant,
        holds: Vec<Hold>,
    }

    impl Record {
        fn new() -> Record {
            Record {
                // Far enough from the clock's start for holds that began before `t0`.
                t0: Instant::now() + Duration::from_secs(10),
                holds: Vec::new(),
            }
        }

        fn at(&self, ms: i64) -> Instant {
            if ms >= 0 {
                self.t0 + Duration::from_millis(ms.unsigned_abs())
            } else {
                self.t0 - Duration::from_millis(ms.unsigned_abs())
            }
        }

        /// A hold of worker `worker` with `fence` from `start` to `end`, told at `lost`.
        fn hold(&mut self, worker: u32, fence: u64, (start, end): (i64, i64), lost: Option<i64>) {
            let group = u64::try_from(self.holds.len()).unwrap();
            self.holds.push(Hold {
                fence: FencingToken::new(fence),
                kind: HoldKind::Exclusive,
                part: 0,
                group,
                slot: None,
                worker: Some(worker),
                attempted: Some(self.at(start - 5)),
                start: self.at(start),
                end: Some(self.at(end)),
                lost_at: lost.map(|ms| self.at(ms)),
            });
        }

        /// A fault from `start` to `end` ms.
        fn fault(&self, start: i64, end: i64) -> FaultTimes {
            FaultTimes::new(self.at(start), self.at(end))
        }

        fn late(&self, workload: &Workload, fault: &FaultTimes) -> Vec<String> {
            let overlaps = FencedResource::new().report().overlap_details;
            self.late_with(&overlaps, workload, fault)
        }

        fn late_with(
            &self,
            overlaps: &[Overlap],
            workload: &Workload,
            fault: &FaultTimes,
        ) -> Vec<String> {
            signal_lags(&self.holds, overlaps, workload, fault, self.at(100_000)).1
        }

        /// The overlap of hold `later` with hold `earlier`, as the resource reports it.
        fn overlap(&self, earlier: usize, later: usize) -> Overlap {
            let (earlier, later) = (&self.holds[earlier], &self.holds[later]);
            Overlap {
                earlier: earlier.fence,
                earlier_worker: earlier.worker,
                earlier_group: earlier.group,
                part: earlier.part,
                later: later.fence,
                at: later.start,
                signalled: earlier.told_by(later.start),
            }
        }
    }

    fn watchdog() -> Workload {
        Workload {
            watchdog: true,
            ..Workload::default()
        }
    }

    /// A fault that ends the lease of every hold it strikes (a Redis restart).
    fn ending_leases() -> Workload {
        Workload {
            fault_loses_data: true,
            fault_ends_leases: true,
            ..watchdog()
        }
    }

    #[test]
    fn a_hold_whose_lease_the_fault_ended_must_be_told() {
        let mut record = Record::new();
        record.hold(1, 10, (-10, 2500), None);
        let late = record.late(&ending_leases(), &record.fault(0, 200));
        assert_eq!(late.len(), 1, "{late:?}");
        assert!(late[0].contains("never told"), "{late:?}");
        assert!(late[0].contains("ended its lease in the store"), "{late:?}");
    }

    #[test]
    fn a_hold_whose_lease_the_fault_ended_told_a_lease_late_is_late() {
        let mut record = Record::new();
        record.hold(1, 10, (-10, 2500), Some(1400));
        let late = record.late(&ending_leases(), &record.fault(0, 200));
        assert_eq!(late.len(), 1, "{late:?}");
        assert!(late[0].contains("told 400 ms after its lease"), "{late:?}");
    }

    #[test]
    fn a_hold_whose_lease_the_fault_ended_told_within_a_lease_is_on_time() {
        let mut record = Record::new();
        // Told a lease and the tolerance after the strike: the last moment on time.
        record.hold(1, 10, (-10, 2500), Some(1050));
        let (workload, fault) = (ending_leases(), record.fault(0, 200));
        assert!(record.late(&workload, &fault).is_empty());
        let (lags, _) = signal_lags(&record.holds, &[], &workload, &fault, record.at(9000));
        assert_eq!(lags, vec![Duration::from_millis(1050)]);
    }

    #[test]
    fn a_struck_hold_that_ended_before_the_bound_is_not_judged() {
        let mut record = Record::new();
        record.hold(1, 10, (-900, 500), None);
        assert!(
            record
                .late(&ending_leases(), &record.fault(0, 200))
                .is_empty()
        );
    }

    #[test]
    fn a_hold_begun_after_the_strike_is_not_struck() {
        let mut record = Record::new();
        record.hold(1, 10, (300, 3000), None);
        assert!(
            record
                .late(&ending_leases(), &record.fault(0, 200))
                .is_empty()
        );
    }

    #[test]
    fn a_watchdog_hold_a_harmless_fault_struck_need_not_be_told() {
        // Latency, a connection reset: the lease lives on.
        let mut record = Record::new();
        record.hold(1, 10, (-10, 3000), None);
        assert!(record.late(&watchdog(), &record.fault(0, 2000)).is_empty());
    }

    #[test]
    fn a_struck_hold_another_holder_got_past_must_be_told() {
        // A leader kill: the promoted replica may have the hold or not; it had not, since it
        // let the second holder in.
        let workload = Workload {
            fault_loses_data: true,
            ..watchdog()
        };
        let mut record = Record::new();
        record.hold(1, 10, (-10, 2500), None);
        record.hold(2, 11, (300, 1500), None);
        let fault = record.fault(0, 200);
        assert!(record.late(&workload, &fault).is_empty(), "no overlap seen");
        let overlaps = [record.overlap(0, 1)];
        let late = record.late_with(&overlaps, &workload, &fault);
        assert_eq!(late.len(), 1, "{late:?}");
        assert!(late[0].starts_with("fence 10"), "{late:?}");
        assert!(late[0].contains("another holder got in"), "{late:?}");
        // The overlap itself is the fence's to cover: it began inside the fault's window.
        let (during, unexcused) = judge_overlaps(&overlaps, &record.holds, &workload, &fault);
        assert_eq!((during.len(), unexcused.len()), (1, 0));
    }

    #[test]
    fn an_unsignalled_overlap_is_excused_only_inside_a_data_losing_fault_window() {
        let workload = Workload {
            fault_loses_data: true,
            ..watchdog()
        };
        let mut record = Record::new();
        record.hold(1, 10, (-10, 3000), None);
        record.hold(2, 11, (1100, 1300), None); // inside: the fault's end plus a lease
        record.hold(3, 12, (1300, 1400), None); // after it
        let overlaps = [record.overlap(0, 1), record.overlap(0, 2)];
        let fault = record.fault(0, 200);
        let (during, unexcused) = judge_overlaps(&overlaps, &record.holds, &workload, &fault);
        assert_eq!(
            during.iter().map(|o| o.later.get()).collect::<Vec<_>>(),
            [11]
        );
        assert_eq!(
            unexcused.iter().map(|o| o.later.get()).collect::<Vec<_>>(),
            [12]
        );
        // Without data loss, neither is.
        let (during, unexcused) = judge_overlaps(&overlaps, &record.holds, &watchdog(), &fault);
        assert_eq!((during.len(), unexcused.len()), (0, 2));
    }

    #[test]
    fn an_overlap_with_a_struck_hold_is_excused_only_if_it_was_told_within_the_faults_bound() {
        // A session lock's connection ended alone: the next waiter gets the lock at once, the
        // holder hears at its next check (at most 300 ms on).
        let workload = Workload {
            fault_told_within: Some(Duration::from_millis(300)),
            ..watchdog()
        };
        let mut record = Record::new();
        record.hold(1, 10, (-10, 3000), Some(250)); // told 250 ms after the strike
        record.hold(2, 11, (-10, 3000), Some(900)); // told 900 ms after it
        record.hold(3, 12, (20, 1500), None);
        let fault = record.fault(0, 10);
        let overlaps = [record.overlap(0, 2), record.overlap(1, 2)];
        let (during, unexcused) = judge_overlaps(&overlaps, &record.holds, &workload, &fault);
        assert_eq!(
            during.iter().map(|o| o.earlier.get()).collect::<Vec<_>>(),
            [10]
        );
        assert_eq!(
            unexcused
                .iter()
                .map(|o| o.earlier.get())
                .collect::<Vec<_>>(),
            [11]
        );
        // Without the bound, neither is.
        let (during, unexcused) = judge_overlaps(&overlaps, &record.holds, &watchdog(), &fault);
        assert_eq!((during.len(), unexcused.len()), (0, 2));
    }

    #[test]
    fn a_partial_loss_strikes_the_holds_granted_after_the_checkpoint() {
        let mut record = Record::new();
        // Asked for before the checkpoint at 0 (the saved state may have it), then after.
        record.hold(1, 10, (-3, 4000), None);
        record.hold(2, 11, (100, 4000), None);
        let fault = FaultTimes {
            strike: record.at(2000),
            struck_since: Some(record.at(0)),
            ..record.fault(-500, 2300)
        };
        assert!(!fault.struck(&record.holds[0]));
        assert!(fault.struck(&record.holds[1]));
        let late = record.late(&ending_leases(), &fault);
        assert_eq!(late.len(), 1, "{late:?}");
        assert!(late[0].starts_with("fence 11"), "{late:?}");
        // Counted from the strike, not the fault's start: told 1 s after the loss is on time.
        record.holds[1].lost_at = Some(record.at(3000));
        assert!(record.late(&ending_leases(), &fault).is_empty());
    }

    #[test]
    fn a_partition_judges_the_cut_off_worker_only() {
        let workload = Workload {
            fault_cuts_off: true,
            ..watchdog()
        };
        let mut record = Record::new();
        record.hold(1, 10, (-10, 3000), None);
        record.hold(2, 11, (-10, 3000), None);
        let fault = FaultTimes {
            cut_worker: Some(2),
            ..record.fault(0, 2500)
        };
        let late = record.late(&workload, &fault);
        assert_eq!(late.len(), 1, "{late:?}");
        assert!(late[0].starts_with("fence 11"), "{late:?}");
        assert!(late[0].contains("cut it off"), "{late:?}");
        // A cut shorter than a lease ends no lease.
        let short = FaultTimes {
            cut_worker: Some(2),
            ..record.fault(0, 900)
        };
        assert!(record.late(&workload, &short).is_empty());
    }

    #[test]
    fn a_fixed_ttl_hold_past_its_lease_must_be_told() {
        let mut record = Record::new();
        record.hold(1, 10, (0, 1500), None);
        record.hold(2, 11, (2000, 3500), Some(2900));
        record.hold(3, 12, (4000, 4900), None); // ended within its lease
        let late = record.late(&Workload::default(), &record.fault(0, 0));
        assert_eq!(late.len(), 1, "{late:?}");
        assert!(late[0].starts_with("fence 10"), "{late:?}");
        assert!(late[0].contains("fixed TTL"), "{late:?}");
    }

    #[test]
    fn the_renewal_rule_flags_a_watchdog_hold_lost_away_from_the_fault() {
        let workload = Workload {
            renewal_rule: true,
            ..watchdog()
        };
        let mut record = Record::new();
        record.hold(1, 10, (-3000, -500), Some(-1700)); // lost long before the fault
        record.hold(2, 11, (-10, 2500), Some(900)); // struck by it
        record.hold(3, 12, (500, 900), Some(800)); // begun within a lease after it
        record.hold(4, 13, (3000, 6000), Some(4400)); // long after it
        record.hold(5, 14, (3000, 6000), None); // kept
        let fault = record.fault(0, 200);
        let lost = renewals_lost(&record.holds, &workload, &fault);
        assert_eq!(lost.len(), 2, "{lost:?}");
        assert!(lost[0].starts_with("fence 10"), "{lost:?}");
        assert!(lost[0].contains("1300 ms into it"), "{lost:?}");
        assert!(lost[1].starts_with("fence 13"), "{lost:?}");
        // Only the soak asks it, and only of watchdog holds.
        assert!(renewals_lost(&record.holds, &watchdog(), &fault).is_empty());
        let fixed = Workload {
            watchdog: false,
            ..workload
        };
        assert!(renewals_lost(&record.holds, &fixed, &fault).is_empty());
    }

    #[test]
    fn the_frozen_holder_rule_flags_a_keeper_that_never_tells_or_tells_a_lease_late() {
        let at_once = Some(Some(Duration::from_millis(3)));
        assert_eq!(frozen_holder_rule(at_once, true), None);
        // The keeper that never tells: a violation where the freeze outlived a lease.
        let never = frozen_holder_rule(Some(None), true).unwrap();
        assert!(never.starts_with(FROZEN_HOLDER_RULE), "{never}");
        assert!(never.contains("never reported"), "{never}");
        // A session lock kept through the freeze: nothing to tell.
        assert_eq!(frozen_holder_rule(Some(None), false), None);
        // The keeper that tells a lease late.
        let late = frozen_holder_rule(Some(Some(Duration::from_millis(1003))), false).unwrap();
        assert!(late.starts_with(FROZEN_HOLDER_RULE), "{late}");
        assert!(late.contains("told 1003 ms after it ran again"), "{late}");
        // Just within the tolerance is at once.
        assert_eq!(frozen_holder_rule(Some(Some(SIGNAL_TOLERANCE)), true), None);
        // No frozen holder in the run.
        assert_eq!(frozen_holder_rule(None, true), None);
    }

    #[test]
    fn a_permit_beyond_the_count_while_a_permit_holder_is_frozen_is_the_frozen_ones() {
        // Two permits. Worker 1 holds one for three leases (renewed, untold), worker 2 is
        // frozen on the other past its lease, and worker 3 takes the permit the store freed:
        // the resource charges the overlap to the earliest untold permit, worker 1's, but the
        // permit the store let go is the frozen one's (the soak's redis semaphore segment 35
        // under holder_sigstop_past_ttl: 152 such overlaps).
        let workload = Workload {
            primitive: Primitive::Semaphore(2),
            ..watchdog()
        };
        let mut record = Record::new();
        record.hold(1, 10, (-100, 3000), None);
        record.hold(2, 11, (0, 3200), Some(3001));
        record.hold(3, 12, (1500, 1600), None);
        for hold in &mut record.holds {
            hold.kind = HoldKind::Permit;
        }
        let fault = FaultTimes {
            paused: Some(super::super::service::Pause {
                pid: 2,
                fence: FencingToken::new(11),
                stopped: record.at(1),
                continued: Some(record.at(3000)),
            }),
            ..record.fault(1, 3000)
        };
        let overlaps = [record.overlap(0, 2)];
        let (during, unexcused) = judge_overlaps(&overlaps, &record.holds, &workload, &fault);
        assert_eq!((during.len(), unexcused.len()), (0, 0), "{unexcused:?}");
        // A fourth permit at once is one more than the frozen holder explains.
        record.hold(4, 13, (1400, 1700), None);
        record.holds[3].kind = HoldKind::Permit;
        let overlaps = [record.overlap(0, 2)];
        let (_, unexcused) = judge_overlaps(&overlaps, &record.holds, &workload, &fault);
        assert_eq!(unexcused.len(), 1);
    }

    #[test]
    fn the_frozen_hold_is_left_to_the_frozen_holder_rule() {
        let mut record = Record::new();
        record.hold(1, 10, (0, 3200), None);
        record.hold(2, 11, (1500, 1600), None); // while it was frozen
        record.hold(3, 12, (3100, 3300), None); // after it ran again
        let fault = FaultTimes {
            paused: Some(super::super::service::Pause {
                pid: 1,
                fence: FencingToken::new(10),
                stopped: record.at(1),
                continued: Some(record.at(3000)),
            }),
            ..record.fault(1, 3000)
        };
        let workload = Workload::default();
        assert!(record.late(&workload, &fault).is_empty());
        let overlaps = [record.overlap(0, 1), record.overlap(0, 2)];
        let (during, unexcused) = judge_overlaps(&overlaps, &record.holds, &workload, &fault);
        assert!(during.is_empty());
        assert_eq!(
            unexcused.iter().map(|o| o.later.get()).collect::<Vec<_>>(),
            [12]
        );
    }
}
