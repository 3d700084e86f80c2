//! URL scheme → backend: the one place `connect` learns which stores this build has. A leaf:
//! it makes backends, and `Locks::connect` wraps them.

use std::sync::Arc;

use crate::backend::DynBackend;
use crate::error::{Error, Result, redact_url, scrub_secrets};

/// Every scheme dlock knows but `memory`, and the cargo feature of its backend: the schemes a
/// build has, in the order [`enabled_schemes`] lists them, and for a build without that
/// backend, the feature to turn on.
const FEATURE_OF_SCHEME: &[(&str, &str)] = &[
    ("sqlite", "sqlite"),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("redis+sentinel", "redis"),
    ("rediss+sentinel", "redis"),
    ("redis+cluster", "redis"),
    ("rediss+cluster", "redis"),
    ("redlock", "redis"),
    ("redlocks", "redis"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("mysql", "mysql"),
    ("mariadb", "mysql"),
    ("etcd", "etcd"),
    ("zk", "zookeeper"),
    ("zookeeper", "zookeeper"),
];

/// The schemes this build can connect to.
pub fn enabled_schemes() -> Vec<&'static str> {
    let built = FEATURE_OF_SCHEME
        .iter()
        .filter(|(_, feature)| built_with(feature))
        .map(|(scheme, _)| *scheme);
    crate::memory::MEMORY_SCHEMES
        .iter()
        .copied()
        .chain(built)
        .collect()
}

/// The cargo features of the backends beyond memory, and whether this build has each.
const BUILT_WITH: &[(&str, bool)] = &[
    ("sqlite", cfg!(feature = "sqlite")),
    ("redis", cfg!(feature = "redis")),
    ("postgres", cfg!(feature = "postgres")),
    ("mysql", cfg!(feature = "mysql")),
    ("etcd", cfg!(feature = "etcd")),
    ("zookeeper", cfg!(feature = "zookeeper")),
];

/// Whether this build has the backend of cargo feature `feature`.
fn built_with(feature: &str) -> bool {
    BUILT_WITH
        .iter()
        .any(|&(name, built)| built && name == feature)
}

pub(crate) async fn connect(url: &str) -> Result<DynBackend> {
    // Every backend redacts the URL it shows; a reason quoting a piece of a malformed URL
    // could still hold a password, so each reason is scrubbed here too.
    connect_scheme(url).await.map_err(|error| match error {
        Error::InvalidUrl { url: shown, reason } => Error::InvalidUrl {
            url: shown,
            reason: scrub_secrets(url, &reason),
        },
        other => other,
    })
}

async fn connect_scheme(url: &str) -> Result<DynBackend> {
    let invalid = |reason: String| Error::InvalidUrl {
        url: redact_url(url),
        reason,
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(invalid(
            "expected SCHEME://…, e.g. sqlite:///var/lib/app/locks.db or memory://".into(),
        ));
    };
    let scheme = scheme.to_ascii_lowercase();
    match scheme.as_str() {
        // Every other scheme refuses options it does not know; memory has none, and a `?…`
        // would otherwise silently become part of the store's name.
        "memory" if rest.contains('?') => Err(invalid(
            "memory:// takes no options (memory://NAME names a store of this process)".into(),
        )),
        "memory" => Ok(Arc::new(crate::memory::MemoryBackend::from_url(url))),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(
            crate::sqlite::SqliteBackend::connect_url(url).await?,
        )),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" | "redis+cluster"
        | "rediss+cluster" => Ok(Arc::new(
            crate::redis::RedisBackend::connect_url(url).await?,
        )),
        #[cfg(feature = "redis")]
        "redlock" | "redlocks" => Ok(Arc::new(
            crate::redlock::RedlockBackend::connect_url(url).await?,
        )),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(
            crate::postgres::PostgresBackend::connect_url(url).await?,
        )),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(Arc::new(
            crate::mysql::MysqlBackend::connect_url(url).await?,
        )),
        #[cfg(feature = "etcd")]
        "etcd" => Ok(Arc::new(crate::etcd::EtcdBackend::connect_url(url).await?)),
        #[cfg(feature = "zookeeper")]
        "zk" | "zookeeper" => Ok(Arc::new(
            crate::zookeeper::ZookeeperBackend::connect_url(url).await?,
        )),
        other => Err(invalid(
            match FEATURE_OF_SCHEME.iter().find(|(s, _)| *s == other) {
                // Known, but its backend was left out of this build.
                Some((_, feature)) => format!(
                    "the {feature} backend is not part of this build (cargo feature `{feature}`); \
                 enabled: {}",
                    enabled_schemes().join(", ")
                ),
                None => format!(
                    "unknown scheme {other:?}; enabled: {}",
                    enabled_schemes().join(", ")
                ),
            },
        )),
    }
}
