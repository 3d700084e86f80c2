//! Extensions that arrive together (the lease keeper's renewals of one pass) go to the server
//! as one `extend_all.lua` script: one round trip and one reply for all of them
//! ([`Gather`]). On a cluster the leases of one batch live in different slots, which one
//! script cannot reach: there each extension goes alone.

use ::redis::RedisResult;

use super::Inner;
use crate::backend::gather::Gather;

/// One extension: the lock's key, token, fence and TTL in ms.
type Extension = (String, String, u64, u64);

/// The extensions waiting for the next batch; each is answered as `extend.lua` answers (1
/// owned, 0 not, or the batch's error).
pub(super) type Renewals = Gather<Extension, RedisResult<i64>>;

/// Extends the lock at `key` with the others that arrive in the same poll. `None` when the
/// batch could not answer for this lease (a value that is not a lock, or the call that sent
/// the batch was dropped): the caller then asks alone.
pub(super) async fn extend(
    inner: &Inner,
    key: &str,
    token: &str,
    fence: u64,
    ttl_ms: u64,
) -> Option<RedisResult<i64>> {
    let extension = (key.to_owned(), token.to_owned(), fence, ttl_ms);
    let answer = inner
        .renewals
        .request(extension, |batch| send(inner, batch))
        .await?;
    // -1: not a lock; `extend.lua` alone gives the error.
    (!matches!(answer, Ok(-1))).then_some(answer)
}

/// Sends `batch` as one `extend_all.lua`.
async fn send(inner: &Inner, batch: Vec<Extension>) -> Option<Vec<RedisResult<i64>>> {
    let mut invocation = inner.scripts().extend_all.prepare_invoke();
    for (key, token, fence, ttl_ms) in &batch {
        invocation.key(key).arg(token).arg(fence).arg(ttl_ms);
    }
    let mut conn = inner.conn();
    let answers: RedisResult<Vec<i64>> = invocation.invoke_async(&mut conn).await;
    Some(match answers {
        Ok(answers) => answers.into_iter().map(Ok).collect(),
        Err(error) => vec![Err(error); batch.len()],
    })
}
