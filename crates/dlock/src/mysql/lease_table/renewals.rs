//! The keeper's gathered renewals of a lease table: one transaction per
//! [`RENEWALS_PER_STATEMENT`] holds, whatever their TTLs.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use sqlx::{AssertSqlSafe, Row};

use crate::sql_common::lease_table::Extension;

use super::{Shared, statements};

/// Names per statement of a gathered renewal, well below the protocol's 65,535 parameters.
const RENEWALS_PER_STATEMENT: usize = 1000;

impl Shared {
    /// Extends every lease of `batch`, [`RENEWALS_PER_STATEMENT`] names per transaction; for
    /// each lease, whether it is still owned. `None` when a transaction failed: each lease then
    /// asks alone.
    pub(super) async fn extend_all(&self, batch: Vec<Extension>) -> Option<Vec<bool>> {
        let mut owned = Vec::with_capacity(batch.len());
        for chunk in batch.chunks(RENEWALS_PER_STATEMENT) {
            match self.extend_chunk(chunk).await {
                Ok(answers) => owned.extend(answers),
                Err(error) => {
                    tracing::debug!(%error, "a gathered renewal failed; each lease asks alone");
                    return None;
                }
            }
        }
        Some(owned)
    }

    /// One transaction: reads (and locks) the rows of `chunk`'s names still held, then moves
    /// the expiry of those whose hold matches, one statement per TTL.
    async fn extend_chunk(&self, chunk: &[Extension]) -> sqlx::Result<Vec<bool>> {
        let names: BTreeSet<&str> = chunk.iter().map(|(name, ..)| name.as_str()).collect();
        let mut tx = self.pool.begin().await?;
        let read = format!(
            "{}{} FOR UPDATE",
            self.sql.owned_of,
            statements::placeholders(names.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(read));
        for name in &names {
            query = query.bind(*name);
        }
        let mut held = HashSet::new();
        for row in query.fetch_all(&mut *tx).await? {
            let name: Vec<u8> = row.try_get(0)?;
            let token: String = row.try_get(1)?;
            let fence: i64 = row.try_get(2)?;
            held.insert((name, token, fence));
        }
        let owned: Vec<bool> = chunk
            .iter()
            .map(|(name, token, fence, _)| {
                held.contains(&(name.as_bytes().to_vec(), token.clone(), *fence))
            })
            .collect();
        let mut by_ttl: BTreeMap<i64, BTreeSet<&str>> = BTreeMap::new();
        for ((name, _, _, ttl_us), _) in chunk.iter().zip(&owned).filter(|(_, owned)| **owned) {
            by_ttl.entry(*ttl_us).or_default().insert(name.as_str());
        }
        for (ttl_us, names) in by_ttl {
            let renew = format!(
                "{}{}",
                self.sql.renew_names,
                statements::placeholders(names.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(renew)).bind(ttl_us);
            for name in names {
                query = query.bind(name);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(owned)
    }
}
