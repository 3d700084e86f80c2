//! [`DoubleBarrier`]: Curator's `DistributedDoubleBarrier` with participants that hold leases.

use std::time::Duration;

use tokio::time::Instant;

use super::members::{self, Members};
use super::{DEFAULT_POLL_INTERVAL, check_poll, deadline, gate, timed_out};
use crate::backend::ValueStore;
use crate::error::{Error, Result};
use crate::locks::Locks;
use crate::mutex::MutexGuard;
use crate::name::LockName;

/// The most participants a double barrier may have (each is a line of its shared value and
/// a lock probed by the entry that completes the round).
pub const MAX_PARTICIPANTS: u32 = 1024;

/// How many compare-and-set rounds a change of the members tries before [`Error::Conflict`].
const ATTEMPTS: u32 = crate::value::DEFAULT_UPDATE_ATTEMPTS;

/// A double barrier of `participants` named `name`; made by [`Locks::double_barrier`].
/// Cheap to clone; nothing is contacted until [`enter`](Self::enter) is awaited.
///
/// [`enter`](Self::enter) waits until `participants` have entered, then every one of them
/// goes in; [`Inside::leave`] waits until every participant has left. Each participant's
/// presence is a hold on the store (the lock `<name>#member-<id>`, renewed by its client's
/// keeper, or a fixed [`ttl`](Self::ttl)), and the value `<name>#members` lists who
/// registered, so the others can tell a participant that is slow from one that is gone:
///
/// - **A participant that crashes before entering** is never counted: the others wait for
///   a participant in its place and, if none comes, end with [`Error::Timeout`] at their
///   deadline (as in Curator: a barrier of N needs N).
/// - **One that crashes inside, before the round starts,** is no longer counted once its
///   lease ends: the entry that would complete the round probes every registered
///   participant's lock and drops those it can take (their holder is gone).
/// - **One that crashes inside, once the round started, or while leaving,** does not wedge
///   the rest: a leaving participant waits on each other participant's presence lock, which
///   a crashed one's store frees when its lease ends (a dropped [`Inside`] frees it at once).
///
/// A participant that drops out at the very instant the round completes may be counted in
/// it, as one that crashes an instant later is: the round then goes on without it.
///
/// A participant entering while a round is under way (someone still inside) joins it at
/// once, as in Curator. Waiting is not a poll per participant: [`enter`](Self::enter) waits
/// as a latch does (one waiter reads the members every [`poll_interval`](Self::poll_interval),
/// the others queue on the lock `<name>#entry` and are handed it by the store's wake-up),
/// and [`leave`](Inside::leave) waits on the others' presence locks, woken by their releases.
///
/// Needs versioned values: every store but Redlock, where [`enter`](Self::enter) returns
/// [`Error::Unsupported`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// let locks = dlock::connect("memory://double-barrier-doc").await?;
/// let step = |locks: dlock::Locks| async move {
///     let inside = locks.double_barrier("batch-7", 2).enter(Duration::from_secs(10)).await?;
///     // ... both participants work here ...
///     inside.leave(Duration::from_secs(10)).await
/// };
/// let other = tokio::spawn(step(locks.clone()));
/// step(locks).await?;
/// other.await.unwrap()?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct DoubleBarrier {
    locks: Locks,
    name: String,
    participants: u32,
    ttl: Option<Duration>,
    poll: Duration,
}

/// One participant inside a [`DoubleBarrier`], from [`DoubleBarrier::enter`]. Its presence
/// lock is held while it lives: dropping it without [`leave`](Self::leave) leaves at once,
/// without waiting for the others (they stop waiting for it).
#[derive(Debug)]
#[must_use = "if unused, the participant leaves at once"]
pub struct Inside {
    barrier: DoubleBarrier,
    id: String,
    presence: MutexGuard,
}

/// The names a barrier uses, checked before any store call.
struct Names {
    members: LockName,
    entry: LockName,
}

impl DoubleBarrier {
    pub(crate) fn new(locks: Locks, name: String, participants: u32) -> DoubleBarrier {
        DoubleBarrier {
            locks,
            name,
            participants,
            ttl: None,
            poll: DEFAULT_POLL_INTERVAL,
        }
    }

    /// The barrier's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many participants make a round.
    pub fn participants(&self) -> u32 {
        self.participants
    }

    /// Holds the presence with a fixed lease of `ttl`, not renewed (see
    /// [`MutexBuilder::ttl`](crate::MutexBuilder::ttl)), instead of the client's watchdog
    /// lease: a participant then counts for `ttl` at most.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How often the participant holding the entry lock reads the members while waiting to
    /// go in (default 50 ms; more than zero).
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    fn names(&self) -> Result<Names> {
        LockName::new(self.name.as_str())?;
        // The longest member lock name, so that no id can make one invalid later.
        self.member(&"0".repeat(32))?;
        Ok(Names {
            members: LockName::new(format!("{}#members", self.name))?,
            entry: LockName::new(format!("{}#entry", self.name))?,
        })
    }

    fn member(&self, id: &str) -> Result<LockName> {
        LockName::new(format!("{}#member-{id}", self.name))
    }

    fn check(&self) -> Result<()> {
        if !(1..=MAX_PARTICIPANTS).contains(&self.participants) {
            return Err(Error::invalid_argument(
                "participants",
                format!("{}; must be 1..={MAX_PARTICIPANTS}", self.participants),
            ));
        }
        check_poll(self.poll).map(drop)
    }

    fn values(&self) -> Result<&dyn ValueStore> {
        super::values(&self.locks, "double barriers (they need versioned values)")
    }

    /// Registers this participant and waits until `participants` have entered, at most
    /// `timeout`; returns at once when a round is under way.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] for 0 or more than [`MAX_PARTICIPANTS`] participants, a
    ///   size other than the one the registered participants use, a zero poll interval, a bad
    ///   TTL or a timeout that overflows the clock; [`Error::InvalidName`]; all before any
    ///   store call, except the size, read from the store (nothing is left registered);
    /// - [`Error::Unsupported`] on a store without versioned values;
    /// - [`Error::Timeout`] (named after the barrier) when the round did not start in time:
    ///   this participant is taken out again;
    /// - [`Error::NotOwned`] when its presence lease was lost while it waited;
    /// - [`Error::WrongType`] for a foreign value under `<name>#members`; store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped entry releases its presence lock, and the others stop counting
    /// it (its line in the members is dropped by the next entry or leave that probes it).
    pub async fn enter(&self, timeout: Duration) -> Result<Inside> {
        self.check()?;
        let names = self.names()?;
        let until = deadline(timeout)?;
        let values = self.values()?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let mut presence = self.locks.mutex(self.member(&id)?.as_str()).no_wait();
        if let Some(ttl) = self.ttl {
            presence = presence.ttl(ttl);
        }
        let presence = presence.acquire().await?;
        let inside = Inside {
            barrier: self.clone(),
            id,
            presence,
        };
        if self.register(values, &names, &inside).await? {
            return Ok(inside);
        }
        let started = || async {
            if inside.presence.is_lost() {
                return Err(Error::not_owned(inside.presence.name().as_str()));
            }
            let (now, _) = self.read(values, &names.members).await?;
            Ok(now.ready && now.ids.contains(&inside.id))
        };
        let entry = names.entry.as_str();
        if gate::wait_at_gate(&self.locks, entry, until, self.poll, started).await? {
            return Ok(inside);
        }
        self.give_up(values, &names, inside, timeout).await
    }

    /// Adds `inside` to the members; whether the round is under way with it.
    async fn register(
        &self,
        values: &dyn ValueStore,
        names: &Names,
        inside: &Inside,
    ) -> Result<bool> {
        for _ in 0..ATTEMPTS {
            let (mut now, version) = self.read(values, &names.members).await?;
            if !now.ids.is_empty() && now.participants != self.participants {
                return Err(Error::invalid_argument(
                    "participants",
                    format!(
                        "{}; the participants of {:?} use {}",
                        self.participants, self.name, now.participants
                    ),
                ));
            }
            // Probing costs a lock attempt per participant: only where the answer matters,
            // when this entry would complete the round or join one under way.
            let completes = now.ids.len() + 1 >= self.participants as usize;
            let gone = if completes || now.ready {
                self.probe_gone(&now.ids).await?
            } else {
                Vec::new()
            };
            for (id, _) in &gone {
                now.remove(id);
            }
            now.participants = self.participants;
            now.ids.push(inside.id.clone());
            now.ready = now.ready || now.ids.len() >= self.participants as usize;
            let written = members::write(values, &names.members, version, &now).await?;
            // The probed locks are let go only now: their holders stayed gone until written.
            release_all(gone).await;
            if written {
                return Ok(now.ready);
            }
        }
        Err(self.conflict())
    }

    /// The participants among `ids` whose presence lock this client could take: gone (their
    /// lease ended or they dropped out), each with the lock, held until they are written out.
    async fn probe_gone(&self, ids: &[String]) -> Result<Vec<(String, MutexGuard)>> {
        let mut gone = Vec::new();
        for id in ids {
            let probe = self.locks.mutex(self.member(id)?.as_str()).no_wait();
            if let Some(held) = probe.try_acquire().await? {
                gone.push((id.clone(), held));
            }
        }
        Ok(gone)
    }

    /// Takes a participant that timed out out of the members, unless the round started in
    /// the meantime (then it is inside after all).
    async fn give_up(
        &self,
        values: &dyn ValueStore,
        names: &Names,
        inside: Inside,
        timeout: Duration,
    ) -> Result<Inside> {
        for _ in 0..ATTEMPTS {
            let (mut now, version) = self.read(values, &names.members).await?;
            if now.ready && now.ids.contains(&inside.id) {
                return Ok(inside);
            }
            if !now.remove(&inside.id)
                || members::write(values, &names.members, version, &now).await?
            {
                if let Err(error) = inside.presence.release().await {
                    // Lost already: the others stopped counting it either way.
                    tracing::debug!(barrier = %self.name, %error, "releasing a presence failed");
                }
                return Err(timed_out(&self.name, timeout));
            }
        }
        Err(self.conflict())
    }

    async fn read(
        &self,
        values: &dyn ValueStore,
        key: &LockName,
    ) -> Result<(Members, Option<u64>)> {
        members::read(values, key, self.locks.info().name).await
    }

    fn conflict(&self) -> Error {
        Error::Conflict {
            name: format!("{}#members", self.name),
            attempts: ATTEMPTS,
        }
    }
}

impl Inside {
    /// The barrier this participant is inside.
    pub fn barrier(&self) -> &DoubleBarrier {
        &self.barrier
    }

    /// Whether this participant's presence lease was lost (the others no longer count it).
    pub fn is_lost(&self) -> bool {
        self.presence.is_lost()
    }

    /// Leaves, then waits until every other participant of the round has left (or is gone:
    /// its lease ended), at most `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] (named after the barrier) when a participant still inside at the
    /// deadline (this one has left all the same); [`Error::InvalidArgument`] for a timeout
    /// that overflows the clock; [`Error::Conflict`]; store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: this participant has left (or leaves as the future is dropped); only the
    /// wait for the others is cut short.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let locks = dlock::connect("memory://leave-doc").await?;
    /// let alone = locks.double_barrier("solo", 1).enter(Duration::from_secs(1)).await?;
    /// alone.leave(Duration::from_secs(1)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn leave(self, timeout: Duration) -> Result<()> {
        let until = deadline(timeout)?;
        let barrier = &self.barrier;
        let names = barrier.names()?;
        let values = barrier.values()?;
        let others = self.take_out(values, &names.members).await?;
        // Others waiting on this participant's presence are woken by this release.
        if let Err(error) = self.presence.release().await {
            tracing::debug!(barrier = %barrier.name, %error, "releasing a presence failed");
        }
        for other in others {
            let left = until.saturating_duration_since(Instant::now());
            let wait = barrier.locks.mutex(barrier.member(&other)?.as_str());
            let held = match wait.wait(left).acquire().await {
                Ok(held) => held,
                Err(Error::Timeout { .. }) => return Err(timed_out(&barrier.name, timeout)),
                Err(error) => return Err(error),
            };
            // It left, or its lease ended: out of the members for good, then let go.
            let written = barrier.forget(values, &names.members, &other).await;
            release_all(vec![(other, held)]).await;
            written?;
        }
        Ok(())
    }

    /// Leaves without waiting for the others, as dropping does, but returns once the store
    /// has answered (the blocking facade's drop).
    #[cfg(feature = "blocking")]
    pub(crate) async fn drop_out(self) -> Result<()> {
        self.presence.release().await
    }

    /// Takes this participant out of the members; the others still registered.
    async fn take_out(&self, values: &dyn ValueStore, key: &LockName) -> Result<Vec<String>> {
        for _ in 0..ATTEMPTS {
            let (mut now, version) = self.barrier.read(values, key).await?;
            if !now.remove(&self.id) || members::write(values, key, version, &now).await? {
                return Ok(now.ids);
            }
        }
        Err(self.barrier.conflict())
    }
}

impl DoubleBarrier {
    /// Takes the participant `id`, known gone, out of the members.
    async fn forget(&self, values: &dyn ValueStore, key: &LockName, id: &str) -> Result<()> {
        for _ in 0..ATTEMPTS {
            let (mut now, version) = self.read(values, key).await?;
            if !now.remove(id) || members::write(values, key, version, &now).await? {
                return Ok(());
            }
        }
        Err(self.conflict())
    }
}

/// Lets go of probed presence locks; a failure is harmless (the probe's lease frees it).
async fn release_all(held: Vec<(String, MutexGuard)>) {
    for (id, guard) in held {
        if let Err(error) = guard.release().await {
            tracing::debug!(%id, %error, "releasing a probed presence failed");
        }
    }
}
