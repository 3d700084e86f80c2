//! A hold of a lease-table row: its renewal (gathered with the client's others), fenced
//! writes and release.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Connection, MySqlConnection};

use crate::backend::{Lease, LeaseCore};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::sql_common::lease_table;

use super::super::error::{from_sqlx, number};
use super::{DEADLOCK_RETRIES, TableLease, us};

#[async_trait]
impl Lease for TableLease {
    fn core(&self) -> &LeaseCore {
        self.lease_core()
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        let shared = self.store();
        let extension = (self.name(), self.token(), self.fence().signed(), us(ttl));
        if let Some(answer) = lease_table::extend_gathered(&shared.renewals, extension, |batch| {
            shared.extend_all(batch)
        })
        .await
        {
            return answer;
        }
        // The driver reports matched rows (CLIENT_FOUND_ROWS), so an extension that does
        // not move the expiry still counts as owned.
        let done = self
            .change_row(&self.store().sql.extend, Some(us(ttl)))
            .await?;
        if done.rows_affected() == 0 {
            return Err(Error::not_owned(self.name()));
        }
        Ok(())
    }

    async fn put_fenced(&self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        let hold = (self.name(), self.token(), self.fence().signed());
        let values = &self.store().values;
        values.put_fenced(hold, value.as_str(), bytes).await
    }

    async fn release(&self) -> Result<()> {
        let done = self.change_row(&self.store().sql.release, None).await?;
        if self.released(&done)? {
            self.store().bell.ring(self.name()).await;
        }
        Ok(())
    }

    async fn release_elsewhere(&self) -> Result<()> {
        // The pool's connections are driven by the client's runtime, which is shutting down
        // and may never answer: one fresh connection on this runtime, for this one statement.
        // The doorbell's connections are the old runtime's too, so a queued waiter in another
        // client is not rung: it finds the lock free at its next poll.
        let options = self.store().pool.connect_options();
        let mut connection = MySqlConnection::connect_with(&options)
            .await
            .map_err(from_sqlx)?;
        let done = sqlx::query(AssertSqlSafe(self.store().sql.release.clone()))
            .bind(self.name())
            .bind(self.token())
            .bind(self.fence().signed())
            .execute(&mut connection)
            .await
            .map_err(from_sqlx);
        // The release is done (or failed) either way; a failed goodbye only drops the socket.
        let _ = connection.close().await;
        self.released(&done?).map(|_| ())
    }
}

/// A hold's own statements.
impl TableLease {
    /// Reads the release statement's result: wakes this client's waiters when the lock is
    /// free, and says whether a waiter of another client asked to be rung.
    fn released(&self, done: &sqlx::mysql::MySqlQueryResult) -> Result<bool> {
        if done.rows_affected() == 0 {
            return Err(Error::not_owned(self.name()));
        }
        // See the statement: the holds left times two, plus one when a ring is asked for.
        let (holds_left, queued) = (done.last_insert_id() / 2, done.last_insert_id() % 2 == 1);
        if holds_left == 0 {
            self.store().wakers.wake(self.name());
        }
        Ok(holds_left == 0 && queued)
    }

    /// Runs `sql` on this hold's row, again while InnoDB picks it as a deadlock victim. Binds:
    /// `ttl_us` when given, then the name, the token and the fence.
    async fn change_row(
        &self,
        sql: &Arc<str>,
        ttl_us: Option<i64>,
    ) -> Result<sqlx::mysql::MySqlQueryResult> {
        unless_deadlocked!({
            let mut statement = sqlx::query(AssertSqlSafe(sql.clone()));
            if let Some(ttl_us) = ttl_us {
                statement = statement.bind(ttl_us);
            }
            statement
                .bind(self.name())
                .bind(self.token())
                .bind(self.fence().signed())
                .execute(&self.store().pool)
                .await
        })
    }
}
