//! The command connection of the Redis backend: one server's (which reconnects by itself), or a
//! Redis Cluster's (which routes each command to the node that owns its keys, and follows
//! `MOVED` and `ASK` while slots move). Both speak through redis-rs's `ConnectionLike`.

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, Pipeline, RedisFuture, Value};

/// A command connection, cheap to clone (clones share the connection).
#[derive(Clone)]
pub(crate) enum Conn {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// The cluster connection, for commands sent to each node in turn.
    pub(crate) fn cluster(&mut self) -> Option<&mut ClusterConnection> {
        match self {
            Conn::Server(_) => None,
            Conn::Cluster(conn) => Some(conn),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Server(conn) => conn.req_packed_command(cmd),
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
            Conn::Server(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}
