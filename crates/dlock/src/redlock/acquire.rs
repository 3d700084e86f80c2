//! One Redlock round: ask every node, keep the lock if a quorum granted it in time, settle
//! its fence on the nodes that gave less.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use super::Inner;
use super::error::too_few_answered;
use super::lease::RedlockLease;
use super::quorum::Answer;
use super::scripts::{ACQUIRE, Keys, SYNC};
use crate::backend::wait::Attempt;
use crate::backend::{AcquireRequest, LeaseCore};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::redis::error::bad_reply;
use crate::redis::ms;

impl Inner {
    /// One Redlock round: ask every node, keep the lock if a quorum granted it in time.
    pub(super) async fn attempt(
        self: &Arc<Self>,
        keys: &Keys,
        req: &AcquireRequest,
        owner: &str,
    ) -> Result<Attempt> {
        let start = Instant::now();
        let timeout = self.node_timeout(req.ttl);
        let others = self.nodes.len() - self.quorum();
        let answers = self.ask_grants(keys, req, owner, timeout).await;
        let Round {
            granted,
            busy_for,
            mut errors,
            undo,
        } = Round::tally(answers);
        if let Some(error) = errors
            .iter()
            .position(|e| !e.is_retryable())
            .map(|i| errors.swap_remove(i))
        {
            self.release_on(&undo, keys, &req.token, timeout).await;
            return Err(error);
        }
        if granted.len() >= self.quorum()
            && let Some(fence) = self.settle_fence(keys, req, owner, &granted, timeout).await
        {
            // Clock drift between this host and the nodes: 1 % of the TTL plus 2 ms, as the
            // lease keeper also allows for.
            let drift = Duration::from_millis(2) + req.ttl / 100;
            if start.elapsed() + drift < req.ttl {
                return Ok(Attempt::Acquired(Arc::new(RedlockLease {
                    inner: self.clone(),
                    keys: keys.clone(),
                    token: req.token.clone(),
                    owner: owner.to_owned(),
                    fence,
                    core: LeaseCore::new(FencingToken::from_signed(fence), start),
                })));
            }
        }
        // No quorum in time: let go at once, so a competitor can win.
        self.release_on(&undo, keys, &req.token, timeout).await;
        if errors.len() > others {
            let reached = self.nodes.len() - errors.len();
            return Err(too_few_answered(
                reached,
                self.nodes.len(),
                self.quorum(),
                &errors,
            ));
        }
        if !granted.is_empty() {
            // A split vote: several clients each got a minority. Back off a random moment so
            // one of them wins the next round.
            let pause = rand::rng().random_range(0..=timeout.as_micros().min(5000) as u64);
            tokio::time::sleep(Duration::from_micros(pause)).await;
            return Ok(Attempt::Busy {
                free_in: Some(Duration::ZERO),
            });
        }
        Ok(Attempt::Busy {
            free_in: free_in(busy_for, self.quorum()),
        })
    }

    /// Asks every node for the lock; decided once a quorum granted, or once too many refused
    /// or failed for one to.
    async fn ask_grants(
        &self,
        keys: &Keys,
        req: &AcquireRequest,
        owner: &str,
        timeout: Duration,
    ) -> Vec<Option<Answer<Vec<i64>>>> {
        let invocation = || {
            let mut invocation = ACQUIRE.key(&keys.lock);
            invocation
                .key(&keys.fence)
                .arg(&req.token)
                .arg(ms(req.ttl))
                .arg(owner);
            invocation
        };
        let (quorum, others) = (self.quorum(), self.nodes.len() - self.quorum());
        // Decided once a quorum granted, or once too many refused or failed for one to.
        self.ask::<Vec<i64>>(&self.all(), timeout, &keys.lock, invocation, |answers| {
            let granted = answers
                .iter()
                .filter(|a| matches!(a, Some(Answer::Reply(r)) if r.first() == Some(&1)))
                .count();
            let against = answers
                .iter()
                .filter(|a| {
                    matches!(a, Some(Answer::Failed(_)))
                        || matches!(a, Some(Answer::Reply(r)) if r.first() != Some(&1))
                })
                .count();
            granted >= quorum || against > others
        })
        .await
    }

    /// The hold's fence: the highest any granting node gave, written back to the granting
    /// nodes that gave less, so whoever wins next on any majority continues above it. `None`
    /// when fewer than a quorum end up holding it at that fence.
    async fn settle_fence(
        &self,
        keys: &Keys,
        req: &AcquireRequest,
        owner: &str,
        granted: &[(usize, i64)],
        timeout: Duration,
    ) -> Option<i64> {
        let fence = granted.iter().map(|(_, f)| *f).max()?;
        let behind: Vec<usize> = granted
            .iter()
            .filter(|(_, f)| *f < fence)
            .map(|(i, _)| *i)
            .collect();
        if behind.is_empty() {
            return Some(fence);
        }
        let synced = self
            .on_nodes::<i64>(&behind, timeout, &keys.lock, || {
                let mut invocation = SYNC.key(&keys.lock);
                invocation
                    .key(&keys.fence)
                    .arg(&req.token)
                    .arg(fence)
                    .arg(owner);
                invocation
            })
            .await;
        let in_line = synced
            .iter()
            .filter(|a| matches!(a, Some(Answer::Reply(1))))
            .count();
        let failed = behind.len() - in_line;
        (granted.len() - failed >= self.quorum()).then_some(fence)
    }
}

/// What the nodes answered to one acquire round.
struct Round {
    /// The nodes that granted, with the fence each gave.
    granted: Vec<(usize, i64)>,
    /// How long each busy node's holder has left, in ms.
    busy_for: Vec<i64>,
    errors: Vec<Error>,
    /// Nodes that granted, or may have (no answer yet, or none in time): a failed round lets
    /// go of these only, never of nodes that were busy (the same token may hold them from an
    /// earlier call).
    undo: Vec<usize>,
}

impl Round {
    fn tally(answers: Vec<Option<Answer<Vec<i64>>>>) -> Round {
        let mut round = Round {
            granted: Vec::new(),
            busy_for: Vec::new(),
            errors: Vec::new(),
            undo: Vec::new(),
        };
        for (index, answer) in answers.into_iter().enumerate() {
            let Some(answer) = answer else {
                round.undo.push(index);
                continue;
            };
            match answer {
                Answer::Reply(reply) => match reply.as_slice() {
                    [1, fence] => {
                        round.granted.push((index, *fence));
                        round.undo.push(index);
                    }
                    [0, left] => round.busy_for.push(*left),
                    _ => round.errors.push(bad_reply("redlock acquire")),
                },
                Answer::Failed(error) => {
                    round.errors.push(error);
                    round.undo.push(index);
                }
            }
        }
        round
    }
}

/// The lock is free once a quorum of nodes has let it go: the `quorum`-th shortest of the
/// busy nodes' remaining leases.
fn free_in(mut busy_for: Vec<i64>, quorum: usize) -> Option<Duration> {
    busy_for.sort_unstable();
    busy_for
        .get(busy_for.len().saturating_sub(quorum))
        .and_then(|left| u64::try_from(*left).ok())
        .map(Duration::from_millis)
}
