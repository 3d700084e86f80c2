//! Store commands per acquisition on Redis, from the server's own counters.

/// The redis-rs URL of a `redis://` lock URL (without dlock's options), if it is one.
pub(crate) fn redis_server(url: &str) -> Option<String> {
    dlock::redis::RedisConfig::from_url(url)
        .ok()
        .map(|config| config.server)
}

/// Commands clients have sent the Redis server so far: the sum of `INFO commandstats` over
/// the commands a client sends (commands run inside scripts are counted there too, but are not
/// round trips). `also` adds commands a peer library sends itself (redis-py's `SET NX PX`):
/// dlock sends only scripts, so `set` inside its scripts must not count for it.
pub(crate) async fn redis_commands(server: &str, also: &[String]) -> anyhow::Result<u64> {
    let mut conn = redis::Client::open(server)?
        .get_multiplexed_async_connection()
        .await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await?;
    const CLIENT_COMMANDS: &[&str] = &[
        "evalsha",
        "eval",
        "script",
        "subscribe",
        "unsubscribe",
        "psubscribe",
        "punsubscribe",
        "ping",
        "hello",
        "client",
        "select",
        "auth",
        "info",
    ];
    Ok(info
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let command = name.split('|').next()?;
            if !CLIENT_COMMANDS.contains(&command) && !also.iter().any(|c| c == command) {
                return None;
            }
            stats
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum())
}

/// Server time (µs, `INFO commandstats`' `usec`) spent so far in `commands` (lowercase names;
/// a script's own commands are inside its time, so name the scripts or the plain commands,
/// not both).
pub(crate) async fn redis_usec(
    conn: &mut redis::aio::ConnectionManager,
    commands: &[&str],
) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    Ok(info
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            if !commands.contains(&name) {
                return None;
            }
            stats
                .split(',')
                .find_map(|field| field.strip_prefix("usec="))?
                .parse::<u64>()
                .ok()
        })
        .sum())
}
