//! Asking every node at once: each answer bounded by the node timeout, a round decided as
//! soon as its answers are enough, the slower nodes finishing in the background.

use std::time::Duration;

use ::redis::FromRedisValue;
use futures::StreamExt;
use futures::stream::FuturesUnordered;

use super::Inner;
use super::error::{on_node, unavailable};
use super::scripts::{Keys, RELEASE};
use crate::error::Error;
use crate::redis::error::map;

/// A script call with its keys and arguments, owned, so it can outlive the round that sent it.
pub(super) type Invocation = ::redis::ScriptInvocation<'static>;

/// What one node answered, within the per-node timeout.
pub(super) enum Answer<T> {
    Reply(T),
    Failed(Error),
}

impl Inner {
    /// The key prefix, the same on every node (the config checks it).
    pub(super) fn prefix(&self) -> &str {
        self.config
            .nodes
            .first()
            .map_or("", |node| node.prefix.as_str())
    }

    pub(super) fn quorum(&self) -> usize {
        self.config.quorum()
    }

    /// The per-node timeout for a lease of `ttl`: much smaller than the TTL.
    pub(super) fn node_timeout(&self, ttl: Duration) -> Duration {
        self.config
            .node_timeout
            .min(ttl / 3)
            .max(Duration::from_millis(1))
    }

    /// Every node's index.
    pub(super) fn all(&self) -> Vec<usize> {
        (0..self.nodes.len()).collect()
    }

    /// Runs `invocation` on the nodes at `indexes` at once, each bounded by `timeout`, and
    /// waits for every answer (`None` for the nodes not asked).
    pub(super) async fn on_nodes<T: FromRedisValue + Send + 'static>(
        &self,
        indexes: &[usize],
        timeout: Duration,
        key: &str,
        invocation: impl Fn() -> Invocation,
    ) -> Vec<Option<Answer<T>>> {
        self.ask(indexes, timeout, key, invocation, |_| false).await
    }

    /// Runs `invocation` on the nodes at `indexes` at once, each bounded by `timeout`, until
    /// `enough` says the answers so far decide the round; the nodes still to answer (`None`)
    /// finish in the background, so a slow node never holds up a decided round.
    pub(super) async fn ask<T: FromRedisValue + Send + 'static>(
        &self,
        indexes: &[usize],
        timeout: Duration,
        key: &str,
        invocation: impl Fn() -> Invocation,
        enough: impl Fn(&[Option<Answer<T>>]) -> bool,
    ) -> Vec<Option<Answer<T>>> {
        let mut pending: FuturesUnordered<_> = indexes
            .iter()
            .map(|&index| {
                let mut conn = self.nodes[index].conn();
                let invocation = invocation();
                let key = key.to_owned();
                let node = self.config.node_label(index);
                async move {
                    let answer = match tokio::time::timeout(
                        timeout,
                        invocation.invoke_async::<T>(&mut conn),
                    )
                    .await
                    {
                        Ok(Ok(reply)) => Answer::Reply(reply),
                        Ok(Err(error)) => Answer::Failed(on_node(&node, map(error, &key))),
                        Err(_) => Answer::Failed(on_node(
                            &node,
                            unavailable(&format!(
                                "no answer within the node timeout of {timeout:?}"
                            )),
                        )),
                    };
                    (index, answer)
                }
            })
            .collect();
        let mut answers: Vec<Option<Answer<T>>> = (0..self.nodes.len()).map(|_| None).collect();
        while let Some((index, answer)) = pending.next().await {
            answers[index] = Some(answer);
            if enough(&answers) {
                break;
            }
        }
        if !pending.is_empty()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move { while pending.next().await.is_some() {} });
        }
        answers
    }

    /// Releases `token` on the nodes at `indexes` at once; returns once a quorum let go (or
    /// too many refused for one to), the rest finish in the background. Returns (released,
    /// not ours, failed) counts.
    pub(super) async fn release_on(
        &self,
        indexes: &[usize],
        keys: &Keys,
        token: &str,
        timeout: Duration,
    ) -> (usize, usize, Vec<Error>) {
        let (quorum, others) = (self.quorum(), self.nodes.len() - self.quorum());
        let answers = self
            .ask::<i64>(
                indexes,
                timeout,
                &keys.lock,
                || {
                    let mut invocation = RELEASE.key(&keys.lock);
                    invocation.arg(token).arg(&keys.channel);
                    invocation
                },
                |answers| {
                    let released = answers
                        .iter()
                        .filter(|a| matches!(a, Some(Answer::Reply(1))))
                        .count();
                    let refused = answers
                        .iter()
                        .filter(|a| matches!(a, Some(Answer::Reply(r)) if *r != 1))
                        .count();
                    released >= quorum || refused > others
                },
            )
            .await;
        let mut counts = (0, 0, Vec::new());
        for answer in answers.into_iter().flatten() {
            match answer {
                Answer::Reply(1) => counts.0 += 1,
                Answer::Reply(_) => counts.1 += 1,
                Answer::Failed(error) => counts.2.push(error),
            }
        }
        counts
    }
}
