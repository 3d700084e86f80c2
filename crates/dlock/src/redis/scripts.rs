//! The Lua scripts of the Redis backend and the keys they touch. Each operation is one
//! script: one round trip, atomic on the server, called by SHA (redis-rs reloads it on
//! `NOSCRIPT`, e.g. after a server restart).
//!
//! Acquire, release and extend start with a fast path (`*_fast.lua`) that runs before
//! `common.lua`'s helpers are built: a script's top-level functions are made again on every
//! call, and on the common path (a free lock with nobody queued, a single hold) that cost
//! more than the script's own commands. The fast path handles only the cases it recognises
//! in full and falls through to the whole script for the rest. Redis Functions (`FCALL`,
//! a library built once) were measured against this and saved nothing more.

use std::sync::LazyLock;

use ::redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind};

use super::conn::Conn;

/// Every script of the backend, in the variant for one way of publishing a release.
pub(super) struct Scripts {
    pub(super) acquire: Script,
    pub(super) acquire_all: Script,
    pub(super) permit_acquire: Script,
    pub(super) permit_release: Script,
    pub(super) permit_extend: Script,
    pub(super) rw_acquire: Script,
    pub(super) rw_release: Script,
    pub(super) rw_extend: Script,
    pub(super) release: Script,
    pub(super) extend: Script,
    pub(super) extend_all: Script,
    pub(super) abandon: Script,
    pub(super) force_release: Script,
    pub(super) inspect: Script,
    pub(super) inspect_shared: Script,
    pub(super) value_put: Script,
    pub(super) value_put_fenced: Script,
    /// The mutex in redis-py's layout ([`RedisLayout::RedisPy`](super::RedisLayout::RedisPy)).
    pub(super) py: PyScripts,
}

/// The scripts of a mutex in redis-py's layout (`scripts/py_*.lua`): the fence arithmetic and
/// the operation, without `common.lua` (they read no dlock value).
pub(super) struct PyScripts {
    pub(super) acquire: Script,
    pub(super) extend: Script,
    pub(super) release: Script,
    pub(super) force_release: Script,
    pub(super) inspect: Script,
    pub(super) put_fenced: Script,
}

/// Releases published with `PUBLISH`: one server, or a cluster without sharded pub/sub (which
/// passes every message to every node).
static PLAIN: LazyLock<Scripts> = LazyLock::new(|| Scripts::new("PUBLISH"));
/// Releases published with `SPUBLISH` on the lock's shard channel (Redis 7 Cluster): only the
/// node that owns the lock's slot carries the message.
static SHARDED: LazyLock<Scripts> = LazyLock::new(|| Scripts::new("SPUBLISH"));

impl Scripts {
    /// The scripts that publish with `SPUBLISH` when `sharded`, else with `PUBLISH`.
    pub(super) fn get(sharded: bool) -> &'static Scripts {
        if sharded { &SHARDED } else { &PLAIN }
    }

    fn new(publish: &'static str) -> Scripts {
        // A script is the shared constants, its fast path if it has one, `fence.lua`,
        // `common.lua` and the operation's own body.
        let with_fast = |fast: &str, body: &str| {
            Script::new(&format!(
                "local WAITER_TTL = {}\nlocal STARVATION = {}\nlocal PUBLISH = '{publish}'\n{fast}\n{}\n{}\n{body}",
                super::config::WAITER_TTL.as_millis(),
                crate::backend::wait::STARVATION_THRESHOLD.as_millis(),
                include_str!("scripts/fence.lua"),
                include_str!("scripts/common.lua"),
            ))
        };
        let script = |body: &str| with_fast("", body);
        let py = |body: &str| {
            Script::new(&format!(
                "local PUBLISH = '{publish}'\n{}\n{body}",
                include_str!("scripts/fence.lua")
            ))
        };
        Scripts {
            acquire: with_fast(
                include_str!("scripts/acquire_fast.lua"),
                include_str!("scripts/acquire.lua"),
            ),
            acquire_all: script(include_str!("scripts/acquire_all.lua")),
            permit_acquire: script(include_str!("scripts/permit_acquire.lua")),
            permit_release: script(include_str!("scripts/permit_release.lua")),
            permit_extend: script(include_str!("scripts/permit_extend.lua")),
            rw_acquire: script(include_str!("scripts/rw_acquire.lua")),
            rw_release: script(include_str!("scripts/rw_release.lua")),
            rw_extend: script(include_str!("scripts/rw_extend.lua")),
            release: with_fast(
                include_str!("scripts/release_fast.lua"),
                include_str!("scripts/release.lua"),
            ),
            extend: with_fast(
                include_str!("scripts/extend_fast.lua"),
                include_str!("scripts/extend.lua"),
            ),
            extend_all: script(include_str!("scripts/extend_all.lua")),
            abandon: script(include_str!("scripts/abandon.lua")),
            force_release: script(include_str!("scripts/force_release.lua")),
            inspect: script(include_str!("scripts/inspect.lua")),
            inspect_shared: script(include_str!("scripts/inspect_shared.lua")),
            value_put: script(include_str!("scripts/value_put.lua")),
            value_put_fenced: script(include_str!("scripts/value_put_fenced.lua")),
            py: PyScripts {
                acquire: py(include_str!("scripts/py_acquire.lua")),
                extend: py(include_str!("scripts/py_extend.lua")),
                release: py(include_str!("scripts/py_release.lua")),
                force_release: py(include_str!("scripts/py_force_release.lua")),
                inspect: py(include_str!("scripts/py_inspect.lua")),
                put_fenced: py(include_str!("scripts/py_put_fenced.lua")),
            },
        }
    }
}

/// An `EVALSHA` of `script` with `keys`, its arguments added by the caller: written straight
/// into one command, where a `ScriptInvocation` copies every key and argument twice. Sent by
/// [`run`].
pub(super) fn evalsha(script: &Script, keys: &[&str]) -> Cmd {
    let mut cmd = ::redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
    cmd
}

/// Sends an [`evalsha`] command of `script`, loading the script once and sending it again
/// when the server does not know it (`NOSCRIPT`: a restarted or new server), as redis-rs does.
pub(super) async fn run<T: FromRedisValue>(
    script: &Script,
    cmd: &Cmd,
    conn: &mut Conn,
) -> RedisResult<T> {
    match cmd.query_async(conn).await {
        Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            cmd.query_async(conn).await
        }
        answered => answered,
    }
}

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
        SharedKeys::named(prefix, name, ["permits", "pfence", "pwake"])
    }

    pub(super) fn rwlock(prefix: &str, name: &str) -> SharedKeys {
        SharedKeys::named(prefix, name, ["rwr", "rw", "rwwake"])
    }

    /// The keys whose kinds are `[holders, state, channel]`, as `{prefix}{kind}:{name}`.
    fn named(prefix: &str, name: &str, [holders, state, channel]: [&str; 3]) -> SharedKeys {
        SharedKeys {
            holders: format!("{prefix}{holders}:{name}"),
            state: format!("{prefix}{state}:{name}"),
            channel: format!("{prefix}{channel}:{name}"),
        }
    }
}

/// The keys and the channel of one lock name under a prefix (layout in `scripts/common.lua`).
/// Only the lock's key is kept: a hold renews by it, and a process may hold a hundred thousand.
/// The queue's keys and the wake channel are made when a wait or a release needs them.
#[derive(Clone, Debug)]
pub(super) struct Keys {
    pub(super) lock: String,
    /// Where the prefix ends in `lock`.
    prefix_len: usize,
}

impl Keys {
    pub(super) fn new(prefix: &str, name: &str) -> Keys {
        Keys {
            lock: lock_key(prefix, name),
            prefix_len: prefix.len(),
        }
    }

    fn prefix(&self) -> &str {
        &self.lock[..self.prefix_len]
    }

    fn name(&self) -> &str {
        &self.lock[self.prefix_len + "lock:".len()..]
    }

    pub(super) fn queue(&self) -> String {
        format!("{}queue:{}", self.prefix(), self.name())
    }

    pub(super) fn qexp(&self) -> String {
        format!("{}qexp:{}", self.prefix(), self.name())
    }

    pub(super) fn channel(&self) -> String {
        channel(self.prefix(), self.name())
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
