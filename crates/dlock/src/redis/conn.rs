//! The command connection of the Redis backend: one server's (which reconnects by itself), or a
//! Redis Cluster's (which routes each command to the node that owns its keys, and follows
//! `MOVED` and `ASK` while slots move). Both speak through redis-rs's `ConnectionLike`.
//!
//! A server's connection also has a blocking side ([`Direct`]): when the command is sent from a
//! thread of the blocking facade ([`crate::backend::caller_thread`]), it goes over a blocking
//! redis-rs connection on that thread, with no hop to a runtime worker and back.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::backend::caller_thread::is_blocking_caller;

/// A command connection, cheap to clone (clones share the connection).
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server: the multiplexed connection, and the blocking connections for commands sent
    /// from blocking callers' threads (none for a Redlock node, whose commands go to every node
    /// at once, which blocking I/O would do one after the other; none with `min_replicas`, see
    /// [`super::node::Primary::connect`]).
    Server(ConnectionManager, Option<Arc<Direct>>),
    Cluster(ClusterConnection),
}

/// Blocking connections to one server, for commands sent from blocking callers' threads: one
/// per thread sending at once, opened on first use and kept while they work.
pub(crate) struct Direct {
    client: ::redis::Client,
    connect_timeout: Duration,
    response_timeout: Duration,
    idle: Mutex<Vec<::redis::Connection>>,
}

/// The client name of the blocking connections (`CLIENT LIST` shows it).
const DIRECT_NAME: &str = "dlock-blocking";

/// How many idle blocking connections a server keeps (more callers at once open more, and
/// close them after use).
const DIRECT_IDLE_MAX: usize = 8;

impl Direct {
    pub(crate) fn new(
        client: ::redis::Client,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Direct {
        Direct {
            client,
            connect_timeout,
            response_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Sends the packed command(s) on an idle connection (or a new one) and reads the replies,
    /// blocking this thread. A connection that failed below the protocol (I/O, a timed-out
    /// reply that may still come) is dropped; one that got a server's error is kept.
    ///
    /// An idle connection found closed (the server restarted, or closed it while it idled)
    /// is replaced and the command sent once more, as the async connection would have
    /// reconnected in the background by then; a new connection's failure is the caller's.
    fn send<T>(
        &self,
        mut exchange: impl FnMut(&mut ::redis::Connection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        if let Some(conn) = idle {
            match self.exchange_on(conn, &mut exchange) {
                Err(error) if error.is_connection_dropped() => {
                    tracing::debug!(%error, "an idle blocking redis connection was closed; reconnecting");
                }
                done => return done,
            }
        }
        self.exchange_on(self.open()?, &mut exchange)
    }

    fn exchange_on<T>(
        &self,
        mut conn: ::redis::Connection,
        exchange: &mut impl FnMut(&mut ::redis::Connection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let result = exchange(&mut conn);
        let reusable = match &result {
            Ok(_) => true,
            Err(error) => error.code().is_some() && !error.is_io_error(),
        };
        if reusable {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.len() < DIRECT_IDLE_MAX {
                idle.push(conn);
            }
        }
        result
    }

    fn open(&self) -> RedisResult<::redis::Connection> {
        let mut conn = self
            .client
            .get_connection_with_timeout(self.connect_timeout)?;
        conn.set_read_timeout(Some(self.response_timeout))?;
        conn.set_write_timeout(Some(self.response_timeout))?;
        // Named for `CLIENT LIST`; a user whose ACL refuses the name still gets the connection.
        if let Err(error) = ::redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(DIRECT_NAME)
            .exec(&mut conn)
        {
            tracing::debug!(%error, "naming a blocking redis connection failed");
        }
        Ok(conn)
    }
}

impl Conn {
    /// The cluster connection, for commands sent to each node in turn.
    pub(crate) fn cluster(&mut self) -> Option<&mut ClusterConnection> {
        match self {
            Conn::Server(..) => None,
            Conn::Cluster(conn) => Some(conn),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Server(_, Some(direct)) if is_blocking_caller() => {
                let direct = direct.clone();
                Box::pin(async move {
                    direct.send(|conn| ::redis::ConnectionLike::req_command(conn, cmd))
                })
            }
            Conn::Server(conn, _) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Server(_, Some(direct)) if is_blocking_caller() => {
                let direct = direct.clone();
                Box::pin(async move {
                    direct.send(|conn| {
                        ::redis::ConnectionLike::req_packed_commands(
                            conn,
                            &pipeline.get_packed_pipeline(),
                            offset,
                            count,
                        )
                    })
                })
            }
            Conn::Server(conn, _) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(conn, _) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}
