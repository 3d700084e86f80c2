//! Store commands per acquisition and server time on Redis, from the server's own counters
//! (`INFO commandstats`).

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
    Ok(command_stats(&info)
        .filter(|(name, _)| {
            let command = name.split('|').next().unwrap_or(name);
            CLIENT_COMMANDS.contains(&command) || also.iter().any(|c| c == command)
        })
        .filter_map(|(_, stats)| stat(stats, "calls"))
        .sum())
}

/// The lines of `INFO commandstats` as (command, its `field=value,…` list).
fn command_stats(info: &str) -> impl Iterator<Item = (&str, &str)> {
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_")?.split_once(':'))
}

/// One counter of a command's `field=value,…` list.
fn stat(stats: &str, field: &str) -> Option<u64> {
    stats
        .split(',')
        .find_map(|pair| pair.strip_prefix(field)?.strip_prefix('='))?
        .parse()
        .ok()
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
    Ok(command_stats(&info)
        .filter(|(name, _)| commands.contains(name))
        .filter_map(|(_, stats)| stat(stats, "usec"))
        .sum())
}
