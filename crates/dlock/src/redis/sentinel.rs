//! Redis Sentinel: the primary found by asking the sentinels (`SENTINEL
//! get-master-addr-by-name`), confirmed by the server itself (`ROLE`), and a follower task
//! that moves the client to the new primary after a failover: at once on the sentinels'
//! `+switch-master` event, after a command failed, and otherwise at a regular check.

use std::sync::{Arc, Weak};
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, Role};
use futures::StreamExt;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use tokio::sync::{Notify, watch};

use super::config::{RedisConfig, SentinelConfig};
use super::error::{BACKEND, map_timed};
use super::node::{Primary, open_client};
use crate::error::{Error, Result};

/// How often the follower asks the sentinels when nothing else made it ask.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// The least time between two questions, however often commands fail.
const MIN_GAP: Duration = Duration::from_millis(100);
/// The sentinels' event after a failover.
const SWITCH_CHANNEL: &str = "+switch-master";
/// How often [`find_primary`] tries when the server named is not primary yet (a failover
/// under way), and the pause between tries.
const FIND_TRIES: u32 = 10;
const FIND_PAUSE: Duration = Duration::from_millis(200);

/// Asks the sentinels for the primary and connects to it, checking that it is one.
///
/// # Errors
///
/// [`Error::Unavailable`] when no sentinel answers or the server named is not a primary
/// (after a few tries); [`Error::InvalidArgument`] when the sentinels answer but monitor no
/// master of that name; [`Error::Unauthenticated`] for refused credentials.
pub(crate) async fn find_primary(
    config: &RedisConfig,
    sentinels: &SentinelConfig,
) -> Result<Primary> {
    let mut asker = Asker::default();
    let mut tries = 0;
    loop {
        let addr = asker.ask(config, sentinels).await?;
        match connect_primary(config, sentinels, &addr).await {
            Ok(primary) => return Ok(primary),
            Err(error) if error.is_retryable() && tries + 1 < FIND_TRIES => {
                tries += 1;
                tracing::debug!(%error, addr, "the primary named is not ready; asking again");
                tokio::time::sleep(FIND_PAUSE).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Starts the task that keeps `sender` on the current primary. It ends when `alive` is gone
/// (the node dropped).
pub(crate) fn follow(
    config: RedisConfig,
    sentinels: SentinelConfig,
    sender: watch::Sender<Arc<Primary>>,
    suspect: Arc<Notify>,
    alive: Weak<()>,
) {
    tokio::spawn(async move {
        let mut asker = Asker::default();
        let mut events: Option<::redis::aio::PubSubStream> = None;
        loop {
            if events.is_none() {
                events = switch_events(&config, &sentinels).await;
            }
            let event = async {
                match events.as_mut() {
                    Some(stream) => stream.next().await.is_some(),
                    None => std::future::pending().await,
                }
            };
            let stream_open = tokio::select! {
                open = event => open,
                () = tokio::time::sleep(CHECK_EVERY) => true,
                () = suspect.notified() => true,
            };
            if !stream_open {
                events = None;
            }
            if alive.strong_count() == 0 {
                return;
            }
            let current = sender.borrow().addr.clone();
            match asker.ask(&config, &sentinels).await {
                Ok(addr) if addr != current => {
                    match connect_primary(&config, &sentinels, &addr).await {
                        Ok(primary) => {
                            tracing::info!(
                                master = %sentinels.master,
                                from = %current,
                                to = %addr,
                                "redis primary moved; following it"
                            );
                            sender.send_replace(Arc::new(primary));
                        }
                        Err(error) => tracing::debug!(%error, addr, "new primary not ready yet"),
                    }
                }
                Ok(_) => {}
                Err(error) => tracing::debug!(%error, "no sentinel answered"),
            }
            tokio::time::sleep(MIN_GAP).await;
        }
    });
}

/// Asks the sentinels in turn, starting with the one that answered last (its connection is
/// kept).
#[derive(Default)]
struct Asker {
    kept: Option<MultiplexedConnection>,
}

impl Asker {
    /// The primary's `host:port` by the first sentinel that knows the master.
    async fn ask(&mut self, config: &RedisConfig, sentinels: &SentinelConfig) -> Result<String> {
        if let Some(mut conn) = self.kept.take()
            && let Ok(Some(addr)) = master_addr(&mut conn, &sentinels.master).await
        {
            self.kept = Some(conn);
            return Ok(addr);
        }
        let mut failures: Vec<String> = Vec::new();
        let mut refused: Option<Error> = None;
        let mut unknown = 0;
        for sentinel in &sentinels.sentinels {
            let answer = async {
                let url = sentinel_url(config, sentinels, sentinel);
                let client = open_client(config, &url)?;
                let connection = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(config.connect_timeout))
                    .set_response_timeout(Some(config.response_timeout));
                let mut conn = client
                    .get_multiplexed_async_connection_with_config(&connection)
                    .await
                    .map_err(|e| map_timed(e, "", config.response_timeout))?;
                let addr = master_addr(&mut conn, &sentinels.master).await?;
                Ok::<_, Error>((conn, addr))
            };
            match answer.await {
                Ok((conn, Some(addr))) => {
                    self.kept = Some(conn);
                    return Ok(addr);
                }
                Ok((_, None)) => unknown += 1,
                Err(error @ (Error::Unauthenticated { .. } | Error::PermissionDenied { .. })) => {
                    failures.push(format!("{sentinel}: {error}"));
                    refused = Some(error);
                }
                Err(error) => failures.push(format!("{sentinel}: {error}")),
            }
        }
        if unknown > 0 {
            return Err(Error::invalid_argument(
                "master",
                format!(
                    "the sentinels monitor no master named {:?} ({unknown} of {} asked said so)",
                    sentinels.master,
                    sentinels.sentinels.len()
                ),
            ));
        }
        if let Some(refused) = refused {
            return Err(refused);
        }
        Err(Error::Unavailable {
            backend: BACKEND,
            source: format!("no sentinel answered ({})", failures.join("; ")).into(),
        })
    }
}

/// `SENTINEL get-master-addr-by-name`: the primary's `host:port`, `None` for a master the
/// sentinel does not monitor.
async fn master_addr(conn: &mut MultiplexedConnection, master: &str) -> Result<Option<String>> {
    let answer: Option<(String, u16)> = ::redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(master)
        .query_async(conn)
        .await
        .map_err(|e| super::error::map(e, ""))?;
    Ok(answer.map(|(host, port)| {
        if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
    }))
}

/// Connects to the server at `addr` and checks it answers `ROLE` as a primary.
async fn connect_primary(
    config: &RedisConfig,
    sentinels: &SentinelConfig,
    addr: &str,
) -> Result<Primary> {
    let url = config.node_url(addr);
    let mut primary = Primary::connect(config, &url, true, true).await?;
    let role: Role = ::redis::cmd("ROLE")
        .query_async(&mut primary.conn)
        .await
        .map_err(|e| map_timed(e, "", config.response_timeout))?;
    if !matches!(role, Role::Primary { .. }) {
        return Err(Error::Unavailable {
            backend: BACKEND,
            source: format!(
                "the sentinels name {addr} as the primary of {:?}, but it is not one (yet)",
                sentinels.master
            )
            .into(),
        });
    }
    primary.addr = addr.to_owned();
    Ok(primary)
}

/// A subscription to the sentinels' failover event, on the first sentinel that takes it;
/// `None` when none does (the regular check still runs).
async fn switch_events(
    config: &RedisConfig,
    sentinels: &SentinelConfig,
) -> Option<::redis::aio::PubSubStream> {
    for sentinel in &sentinels.sentinels {
        let subscribed = async {
            let client = open_client(config, &sentinel_url(config, sentinels, sentinel)).ok()?;
            let mut pubsub = client.get_async_pubsub().await.ok()?;
            pubsub.subscribe(SWITCH_CHANNEL).await.ok()?;
            Some(pubsub.into_on_message())
        };
        let wait = config.connect_timeout + config.response_timeout;
        if let Ok(Some(stream)) = tokio::time::timeout(wait, subscribed).await {
            return Some(stream);
        }
    }
    None
}

/// The URL of one sentinel: the primary's scheme (TLS or not) and fragment, the sentinels' own
/// credentials.
fn sentinel_url(config: &RedisConfig, sentinels: &SentinelConfig, addr: &str) -> String {
    let scheme = config.server.split_once("://").map_or("redis", |(s, _)| s);
    let encode = |text: &str| utf8_percent_encode(text, NON_ALPHANUMERIC).to_string();
    let userinfo = match (&sentinels.username, &sentinels.password) {
        (Some(user), Some(password)) => format!("{}:{}@", encode(user), encode(password)),
        (Some(user), None) => format!("{}@", encode(user)),
        (None, Some(password)) => format!(":{}@", encode(password)),
        (None, None) => String::new(),
    };
    let fragment = config
        .server
        .split_once('#')
        .map(|(_, fragment)| format!("#{fragment}"))
        .unwrap_or_default();
    format!("{scheme}://{userinfo}{addr}{fragment}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentinel_url_has_the_sentinels_credentials() {
        let config =
            RedisConfig::from_url("rediss+sentinel://app:pw@s1/orders?sentinel_password=a%26b")
                .unwrap();
        let sentinels = config.sentinel.clone().unwrap();
        assert_eq!(
            sentinel_url(&config, &sentinels, "s1:26379"),
            "rediss://:a%26b@s1:26379"
        );
    }
}
