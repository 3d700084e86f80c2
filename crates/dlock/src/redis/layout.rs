//! How a Redis client lays out its mutexes in the store: dlock's own layout, or redis-py's, so
//! that a fleet can move from redis-py to dlock one process at a time.

use crate::error::{Error, Result};

/// How mutexes are kept in Redis (URL `layout`).
///
/// Semaphores, read-write locks and values keep dlock's keys in both layouts: redis-py has
/// none of them.
///
/// # Examples
///
/// ```
/// use dlock::redis::{RedisConfig, RedisLayout};
/// let config = RedisConfig::from_url("redis://127.0.0.1:6379/0?layout=redis-py").unwrap();
/// assert_eq!(config.layout, RedisLayout::RedisPy);
/// assert_eq!(RedisConfig::default().layout, RedisLayout::Dlock);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisLayout {
    /// dlock's layout (`layout=dlock`, the default): the lock's value holds its token, fence,
    /// hold count, queue flag and owner under the prefix; reentrant and fair locks, listing,
    /// multi-locks in one script.
    #[default]
    Dlock,
    /// redis-py's layout (`layout=redis-py`): the lock is the key `NAME` itself, holding the
    /// holder's token with a `PX` expiry, as redis-py's `Lock` writes it, so redis-py and
    /// dlock holders of one name exclude each other. The fence and owner sit beside it in
    /// `{prefix}pylock:NAME`, which redis-py never reads. Not on a Redis Cluster (the two keys
    /// would hash to different slots); no reentrant or fair locks and no listing (the locks
    /// have no common prefix); a dlock waiter behind a redis-py holder is woken by polling
    /// (redis-py publishes nothing).
    RedisPy,
}

impl RedisLayout {
    /// The URL's name of the layout.
    pub fn as_str(self) -> &'static str {
        match self {
            RedisLayout::Dlock => "dlock",
            RedisLayout::RedisPy => "redis-py",
        }
    }

    /// The layout a URL's `layout` option names.
    pub(super) fn parse(text: &str) -> Option<RedisLayout> {
        [RedisLayout::Dlock, RedisLayout::RedisPy]
            .into_iter()
            .find(|layout| layout.as_str() == text)
    }

    /// Refuses redis-py's layout on a cluster: the lock's key and its side key would hash to
    /// different slots, and no script can write both.
    pub(super) fn validate(self, cluster: bool) -> Result<()> {
        if self == RedisLayout::RedisPy && cluster {
            return Err(Error::invalid_argument(
                "layout",
                "redis-py's layout is for one server or a Sentinel primary: on a Redis Cluster \
                 a lock's key and the key that keeps its fence hash to different slots",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::RedisConfig;
    use super::*;

    #[test]
    fn the_layout_is_read_from_the_url_and_refused_on_a_cluster() {
        let config = RedisConfig::from_url("redis://h:1/0?layout=redis-py").unwrap();
        assert_eq!(config.layout, RedisLayout::RedisPy);
        let sentinel = RedisConfig::from_url("redis+sentinel://s1/main?layout=redis-py").unwrap();
        assert_eq!(sentinel.layout, RedisLayout::RedisPy);
        assert_eq!(
            RedisConfig::from_url("redis://h?layout=dlock")
                .unwrap()
                .layout,
            RedisLayout::Dlock
        );
        for url in ["redis://h?layout=redis_py", "redis://h?layout="] {
            let error = RedisConfig::from_url(url).unwrap_err();
            assert!(matches!(error, Error::InvalidUrl { .. }), "{url}: {error}");
        }
        let cluster = RedisConfig::from_url("redis+cluster://a:1,b:2?layout=redis-py").unwrap_err();
        assert!(cluster.to_string().contains("layout"), "{cluster}");
    }
}
