//! The scripts every node runs (`scripts/*.lua`, each after the Redis backend's `fence.lua`
//! and this folder's `common.lua`) and the keys of a
//! lock name on every node.

use std::sync::LazyLock;

use ::redis::Script;

fn script(body: &str) -> Script {
    Script::new(&format!(
        "{}\n{}\n{body}",
        include_str!("../redis/scripts/fence.lua"),
        include_str!("scripts/common.lua")
    ))
}

pub(super) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/acquire.lua")));
pub(super) static SYNC: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/sync.lua")));
pub(super) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/extend.lua")));
pub(super) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/release.lua")));

/// The keys and channel of one lock name on every node.
#[derive(Clone, Debug)]
pub(super) struct Keys {
    pub(super) lock: String,
    pub(super) fence: String,
    pub(super) channel: String,
}

impl Keys {
    pub(super) fn new(prefix: &str, name: &str) -> Keys {
        Keys {
            lock: format!("{prefix}rlock:{name}"),
            fence: format!("{prefix}rfence:{name}"),
            channel: format!("{prefix}wake:{name}"),
        }
    }
}
