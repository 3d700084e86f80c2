//! Redis Cluster: the connection (redis-rs routes each command by its keys' slot and follows
//! `MOVED`/`ASK`), the hash tag that keeps every key of one lock in one slot, and the
//! primaries that listing walks.

use ::redis::cluster::{ClusterClient, ClusterClientBuilder};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use std::borrow::Cow;

use super::config::RedisConfig;
use super::conn::Conn;
use super::error::{BACKEND, map_timed};
use super::node::{Primary, open_client};
use crate::error::{Error, Result};

/// The name as it appears in a key of a cluster lock: inside a hash tag, after a `=` so the
/// tag is never empty (a name starting with `}` would otherwise empty it). Every key of the
/// lock then hashes by the same text, so its script finds them on one node.
pub(crate) fn tagged(name: &str) -> String {
    format!("{{={name}}}")
}

/// The name a key of a cluster lock holds, as [`tagged`] wrote it.
pub(crate) fn untagged(in_key: &str) -> Cow<'_, str> {
    in_key
        .strip_prefix("{=")
        .and_then(|rest| rest.strip_suffix('}'))
        .map_or(Cow::Borrowed(in_key), Cow::Borrowed)
}

/// The slot of a key.
pub(crate) fn slot(key: &str) -> Slot {
    Slot::for_key(key)
}

/// Connects to the cluster through its seed nodes and checks it is one; also says whether its
/// servers have sharded pub/sub (`SPUBLISH`, Redis 7).
///
/// # Errors
///
/// [`Error::InvalidArgument`] when a node is not a cluster node; as for one server otherwise.
pub(crate) async fn connect(config: &RedisConfig) -> Result<(Primary, bool)> {
    let urls = seed_urls(config);
    let client = build(builder(config)?, config)?;
    // redis-rs folds the first failure of every seed node into one I/O error: read it.
    let conn: ClusterConnection = client.get_async_connection().await.map_err(|e| {
        let text = e.to_string();
        if text.contains("cluster support disabled") {
            not_a_cluster(config)
        } else if text.contains("AuthenticationFailed") || text.contains("WRONGPASS") {
            Error::Unauthenticated {
                backend: BACKEND,
                source: Box::new(e),
            }
        } else {
            map_timed(e, "", config.response_timeout)
        }
    })?;
    let mut conn = Conn::Cluster(conn);
    let state: String = ::redis::cmd("CLUSTER")
        .arg("INFO")
        .query_async(&mut conn)
        .await
        .map_err(|e| map_timed(e, "", config.response_timeout))?;
    if !state.contains("cluster_state:ok") {
        return Err(Error::Unavailable {
            backend: BACKEND,
            source: "the cluster is not serving every slot (cluster_state is not ok)".into(),
        });
    }
    // `COMMAND INFO` answers nil for a command the server does not know.
    let spublish: Vec<::redis::Value> = ::redis::cmd("COMMAND")
        .arg("INFO")
        .arg("SPUBLISH")
        .query_async(&mut conn)
        .await
        .map_err(|e| map_timed(e, "", config.response_timeout))?;
    let sharded = matches!(spublish.first(), Some(v) if *v != ::redis::Value::Nil);
    let clients = urls
        .iter()
        .map(|url| open_client(config, url))
        .collect::<Result<Vec<_>>>()?;
    let primary = Primary {
        addr: config.cluster.join(","),
        client: clients[0].clone(),
        others: clients[1..].to_vec(),
        conn,
    };
    Ok((primary, sharded))
}

/// The seed nodes' URLs.
fn seed_urls(config: &RedisConfig) -> Vec<String> {
    config.cluster.iter().map(|n| config.node_url(n)).collect()
}

/// A cluster client of the seed nodes, with the configured timeouts and TLS roots.
fn builder(config: &RedisConfig) -> Result<ClusterClientBuilder> {
    let mut builder = ClusterClientBuilder::new(seed_urls(config))
        .connection_timeout(config.connect_timeout)
        .response_timeout(config.response_timeout)
        .retries(2);
    if let Some(path) = &config.ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| Error::invalid_argument("ca", format!("{}: {e}", path.display())))?;
        builder = builder.certs(::redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        });
    }
    Ok(builder)
}

fn build(builder: ClusterClientBuilder, config: &RedisConfig) -> Result<ClusterClient> {
    builder.build().map_err(|e| Error::InvalidUrl {
        url: crate::error::redact_url(&config.server),
        reason: e.to_string(),
    })
}

/// A cluster client for sharded pub/sub: RESP3, with every push (shard messages, subscription
/// confirmations, disconnections) sent to `pushes`. redis-rs sends each `SSUBSCRIBE` to the
/// node that owns the channel's slot and subscribes again where the slot goes.
pub(crate) fn pubsub_client(
    config: &RedisConfig,
    pushes: tokio::sync::mpsc::UnboundedSender<::redis::PushInfo>,
) -> Result<ClusterClient> {
    let builder = builder(config)?
        .use_protocol(::redis::ProtocolVersion::RESP3)
        .push_sender(pushes);
    build(builder, config)
}

fn not_a_cluster(config: &RedisConfig) -> Error {
    Error::invalid_argument(
        "cluster",
        format!(
            "{} is not a Redis Cluster node (its cluster support is disabled); use redis:// for one server",
            config.cluster.join(",")
        ),
    )
}

/// The primaries' `host:port`, sorted, as `CLUSTER NODES` shows them.
pub(crate) async fn primaries(conn: &mut ClusterConnection) -> ::redis::RedisResult<Vec<String>> {
    let nodes: String = ::redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(conn)
        .await?;
    let mut primaries: Vec<String> = nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let flags = *fields.get(2)?;
            let serving = fields.len() > 8;
            (flags.split(',').any(|f| f == "master") && !flags.contains("fail") && serving)
                .then(|| fields[1].split('@').next().unwrap_or_default().to_owned())
        })
        .collect();
    primaries.sort();
    Ok(primaries)
}

/// Routing of a command to the node at `addr` (`host:port`).
pub(crate) fn to_node(addr: &str) -> Option<RoutingInfo> {
    let (host, port) = addr.rsplit_once(':')?;
    Some(RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
        port: port.parse().ok()?,
    }))
}

/// Routing of a command with no key (`WAIT`) to the primary that serves `key`'s slot.
pub(crate) fn to_slot_primary(key: &str) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_slot(
        slot(key),
        SlotAddr::Master,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_a_lock_has_one_slot_whatever_its_name() {
        for name in ["jobs/1", "}x", "a}b", "a{b", "{}", "=", ""] {
            let lock = format!("dlock:lock:{}", tagged(name));
            let queue = format!("dlock:queue:{}", tagged(name));
            assert_eq!(slot(&lock), slot(&queue), "{name:?}");
            assert_eq!(untagged(&tagged(name)), name);
        }
    }
}
