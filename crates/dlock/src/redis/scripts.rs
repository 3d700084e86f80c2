//! The Lua scripts of the Redis backend and the keys they touch. Each operation is one
//! script: one round trip, atomic on the server, called by SHA (redis-rs reloads it on
//! `NOSCRIPT`, e.g. after a server restart).

use std::sync::LazyLock;

use ::redis::Script;

/// Builds a script from the shared constants, `common.lua` and the operation's own body.
fn script(body: &str) -> Script {
    Script::new(&format!(
        "local WAITER_TTL = {}\nlocal STARVATION = {}\n{}\n{body}",
        super::config::WAITER_TTL.as_millis(),
        crate::backend::wait::STARVATION_THRESHOLD.as_millis(),
        include_str!("scripts/common.lua"),
    ))
}

pub(super) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/acquire.lua")));
pub(super) static ACQUIRE_ALL: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/acquire_all.lua")));
pub(super) static PERMIT_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/permit_acquire.lua")));
pub(super) static PERMIT_RELEASE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/permit_release.lua")));
pub(super) static PERMIT_EXTEND: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/permit_extend.lua")));
pub(super) static RW_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/rw_acquire.lua")));
pub(super) static RW_RELEASE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/rw_release.lua")));
pub(super) static RW_EXTEND: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/rw_extend.lua")));
pub(super) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/release.lua")));
pub(super) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/extend.lua")));
pub(super) static ABANDON: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/abandon.lua")));
pub(super) static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/force_release.lua")));
pub(super) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/inspect.lua")));
pub(super) static INSPECT_SHARED: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/inspect_shared.lua")));

/// Versioned values stand alone: they share nothing with the lock scripts.
pub(super) static VALUE_PUT: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/value_put.lua")));

/// The key of a versioned value (a hash; values have their own namespace beside the locks).
pub(super) fn value_key(prefix: &str, name: &str) -> String {
    format!("{prefix}value:{name}")
}

/// The keys and the channel of one native semaphore or read-write lock: a zset of holders
/// scored by lease end, a hash of fences (and a read-write lock's writer), a wake channel.
/// Layouts in `scripts/permit_acquire.lua` and `scripts/rw_acquire.lua`.
#[derive(Clone, Debug)]
pub(super) struct SharedKeys {
    pub(super) holders: String,
    pub(super) state: String,
    pub(super) channel: String,
}

impl SharedKeys {
    pub(super) fn permits(prefix: &str, name: &str) -> SharedKeys {
        SharedKeys {
            holders: format!("{prefix}permits:{name}"),
            state: format!("{prefix}pfence:{name}"),
            channel: format!("{prefix}pwake:{name}"),
        }
    }

    pub(super) fn rwlock(prefix: &str, name: &str) -> SharedKeys {
        SharedKeys {
            holders: format!("{prefix}rwr:{name}"),
            state: format!("{prefix}rw:{name}"),
            channel: format!("{prefix}rwwake:{name}"),
        }
    }
}

/// The keys and the channel of one lock name under a prefix (layout in `scripts/common.lua`).
#[derive(Clone, Debug)]
pub(super) struct Keys {
    pub(super) lock: String,
    pub(super) queue: String,
    pub(super) qexp: String,
    pub(super) channel: String,
}

impl Keys {
    pub(super) fn new(prefix: &str, name: &str) -> Keys {
        Keys {
            lock: lock_key(prefix, name),
            queue: format!("{prefix}queue:{name}"),
            qexp: format!("{prefix}qexp:{name}"),
            channel: channel(prefix, name),
        }
    }
}

pub(super) fn lock_key(prefix: &str, name: &str) -> String {
    format!("{prefix}lock:{name}")
}

pub(super) fn channel(prefix: &str, name: &str) -> String {
    format!("{prefix}wake:{name}")
}

/// The `SCAN MATCH` pattern for the keys `key_prefix` + a name that starts with
/// `name_prefix`, with the glob's special characters escaped.
pub(crate) fn scan_pattern(key_prefix: &str, name_prefix: &str) -> String {
    let mut pattern = String::with_capacity(key_prefix.len() + name_prefix.len() + 8);
    for c in key_prefix.chars().chain(name_prefix.chars()) {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    pattern
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_pattern_escapes_glob_characters() {
        assert_eq!(
            scan_pattern("dlock:lock:", "a*b?[c]\\"),
            "dlock:lock:a\\*b\\?\\[c\\]\\\\*"
        );
        assert_eq!(scan_pattern("lock:", ""), "lock:*");
    }
}
