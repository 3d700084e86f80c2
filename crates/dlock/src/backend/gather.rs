//! Requests that arrive together, sent together: the lease keeper starts the renewals of one
//! pass in one poll ([`crate::lease`]), and a store that can answer many of them in one round
//! trip (one Redis script, one SQLite transaction) gathers them here.
//!
//! Each caller puts its request in the pending list and yields once, so the others of that
//! poll add theirs; the first to run again takes the whole list, sends it, and hands every
//! caller its own answer. A caller whose request went out with a batch that could not answer
//! it (the call that sent it was dropped, or the store failed the batch) gets `None` and asks
//! alone, so a failure is reported exactly as an unbatched request would report it.

#![cfg_attr(not(dlock_all_backends), allow(dead_code, unused_imports))]

use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// Requests of type `R` waiting for the next batch, each answered with an `A`.
#[derive(Debug)]
pub(crate) struct Gather<R, A> {
    pending: Mutex<Vec<(R, oneshot::Sender<A>)>>,
}

impl<R, A> Default for Gather<R, A> {
    fn default() -> Self {
        Gather {
            pending: Mutex::new(Vec::new()),
        }
    }
}

impl<R, A> Gather<R, A> {
    fn lock(&self) -> MutexGuard<'_, Vec<(R, oneshot::Sender<A>)>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `request` to the next batch and waits for its answer. If this caller is the one
    /// that takes the batch, `send` sends it: it gets the requests in order and returns one
    /// answer per request in the same order, or `None` when the batch failed as a whole.
    pub(crate) async fn request<S, F>(&self, request: R, send: S) -> Option<A>
    where
        S: FnOnce(Vec<R>) -> F,
        F: Future<Output = Option<Vec<A>>>,
    {
        let (answer, answered) = oneshot::channel();
        self.lock().push((request, answer));
        // The others started in this poll add theirs meanwhile.
        tokio::task::yield_now().await;
        let batch = std::mem::take(&mut *self.lock());
        if !batch.is_empty() {
            let (requests, answers): (Vec<R>, Vec<oneshot::Sender<A>>) = batch.into_iter().unzip();
            let count = requests.len();
            // Answers that cannot be matched to the requests are none: each asks alone.
            if let Some(replies) = send(requests).await.filter(|r| r.len() == count) {
                for (answer, reply) in answers.into_iter().zip(replies) {
                    let _ = answer.send(reply);
                }
            }
        }
        answered.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn requests_of_one_poll_go_in_one_batch_and_each_gets_its_answer() {
        let gather = Gather::<u32, u32>::default();
        let batches = AtomicUsize::new(0);
        let send = |requests: Vec<u32>| {
            batches.fetch_add(1, Ordering::SeqCst);
            async move { Some(requests.iter().map(|r| r * 10).collect()) }
        };
        let answers = futures::future::join_all((1..=5).map(|n| gather.request(n, send))).await;
        assert_eq!(
            answers,
            vec![Some(10), Some(20), Some(30), Some(40), Some(50)]
        );
        assert_eq!(batches.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_failed_batch_answers_none_so_each_asks_alone() {
        let gather = Gather::<u32, u32>::default();
        let send = |_: Vec<u32>| async { None };
        let answers = futures::future::join_all((1..=3).map(|n| gather.request(n, send))).await;
        assert_eq!(answers, vec![None, None, None]);
    }

    #[tokio::test]
    async fn a_dropped_sender_leaves_no_request_behind() {
        let gather = Gather::<u32, u32>::default();
        let never = |_: Vec<u32>| std::future::pending::<Option<Vec<u32>>>();
        // The first call takes the batch and hangs in `send`; dropping it drops the batch.
        let hung = tokio::time::timeout(
            std::time::Duration::from_millis(20),
            futures::future::join(gather.request(1, never), gather.request(2, never)),
        )
        .await;
        assert!(hung.is_err());
        let send = |requests: Vec<u32>| async move { Some(requests) };
        assert_eq!(gather.request(3, send).await, Some(3));
    }
}
