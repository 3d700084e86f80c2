//! Extensions that arrive together go to the server as one script. The lease keeper starts
//! the renewals of one pass in one poll ([`crate::lease`]); each extension puts its lease in
//! the pending list and yields once, so the others of that poll join it; the first to run
//! again takes the whole list and sends it with `extend_all.lua` (one round trip, one reply
//! for all), then hands each lease its answer. Ten thousand watched locks then cost a few
//! scripts a second instead of thousands.
//!
//! On a cluster the leases of one batch live in different slots, which one script cannot
//! reach: there each extension goes alone.

use std::sync::{Mutex, MutexGuard, PoisonError};

use ::redis::RedisResult;
use tokio::sync::oneshot;

use super::Inner;

/// The extensions waiting for the next batch.
#[derive(Debug, Default)]
pub(super) struct Renewals {
    pending: Mutex<Vec<Pending>>,
}

#[derive(Debug)]
struct Pending {
    key: String,
    token: String,
    fence: u64,
    ttl_ms: u64,
    /// `extend.lua`'s answer for this lease (1 owned, 0 not), -1 to ask alone.
    answer: oneshot::Sender<RedisResult<i64>>,
}

impl Renewals {
    fn lock(&self) -> MutexGuard<'_, Vec<Pending>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Extends the lock at `key` with the others that arrive in the same poll. `None` when
    /// the batch could not answer for this lease (a value that is not a lock, or the call
    /// that sent the batch was dropped): the caller then asks alone.
    pub(super) async fn extend(
        &self,
        inner: &Inner,
        key: &str,
        token: &str,
        fence: u64,
        ttl_ms: u64,
    ) -> Option<RedisResult<i64>> {
        let (answer, answered) = oneshot::channel();
        self.lock().push(Pending {
            key: key.to_owned(),
            token: token.to_owned(),
            fence,
            ttl_ms,
            answer,
        });
        // The others started in this poll add theirs meanwhile.
        tokio::task::yield_now().await;
        let batch = std::mem::take(&mut *self.lock());
        if !batch.is_empty() {
            send(inner, batch).await;
        }
        match answered.await {
            Ok(Ok(-1)) | Err(_) => None,
            Ok(answer) => Some(answer),
        }
    }
}

/// Sends `batch` as one `extend_all.lua` and hands out the answers.
async fn send(inner: &Inner, batch: Vec<Pending>) {
    let mut invocation = inner.scripts().extend_all.prepare_invoke();
    for pending in &batch {
        invocation
            .key(&pending.key)
            .arg(&pending.token)
            .arg(pending.fence)
            .arg(pending.ttl_ms);
    }
    let mut conn = inner.conn();
    let answers: RedisResult<Vec<i64>> = invocation.invoke_async(&mut conn).await;
    match answers {
        Ok(answers) if answers.len() == batch.len() => {
            for (pending, answer) in batch.into_iter().zip(answers) {
                let _ = pending.answer.send(Ok(answer));
            }
        }
        // A short reply cannot be matched to the leases: each asks alone.
        Ok(_) => {}
        Err(error) => {
            for pending in batch {
                let _ = pending.answer.send(Err(error.clone()));
            }
        }
    }
}
