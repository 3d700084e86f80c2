//! The shared state of a double barrier: one versioned value, `<barrier>#members`, holding the
//! barrier's size, whether its round is under way (`ready`: every participant may go in) and
//! the ids of the participants registered in it. Each id also names the participant's
//! presence lock; the value only says who to look for, the locks say who is alive.

use crate::backend::{Expect, ValueStore};
use crate::error::{Error, Result};
use crate::name::LockName;

/// Marks the value as a double barrier's (and its layout's version).
const MAGIC: &str = "dlb1";

/// What the value says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Members {
    /// The size the participants agreed on; 0 while nobody is registered.
    pub(super) participants: u32,
    /// Whether the round is under way: set by the entry that made the size, cleared by the
    /// leave that took the last participant out.
    pub(super) ready: bool,
    /// The registered participants' ids, in the order they entered.
    pub(super) ids: Vec<String>,
}

impl Members {
    /// Takes `id` out; the round ends with the last participant.
    pub(super) fn remove(&mut self, id: &str) -> bool {
        let before = self.ids.len();
        self.ids.retain(|other| other != id);
        if self.ids.is_empty() {
            *self = Members::default();
        }
        self.ids.len() != before
    }

    fn encode(&self) -> Vec<u8> {
        let state = if self.ready { "ready" } else { "open" };
        let mut text = format!("{MAGIC} {} {state}\n", self.participants);
        for id in &self.ids {
            text.push_str(id);
            text.push('\n');
        }
        text.into_bytes()
    }

    fn decode(bytes: &[u8]) -> Option<Members> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = text.lines();
        let mut head = lines.next()?.split(' ');
        if head.next()? != MAGIC {
            return None;
        }
        let participants = head.next()?.parse().ok()?;
        let ready = match head.next()? {
            "ready" => true,
            "open" => false,
            _ => return None,
        };
        let ids = lines.map(str::to_owned).collect();
        Some(Members {
            participants,
            ready,
            ids,
        })
    }
}

/// The state of `key` and its version (`None`: never written, nobody registered).
pub(super) async fn read(
    values: &dyn ValueStore,
    key: &LockName,
    backend: &'static str,
) -> Result<(Members, Option<u64>)> {
    let Some(read) = values.get(key).await? else {
        return Ok((Members::default(), None));
    };
    let members = Members::decode(&read.value).ok_or_else(|| Error::WrongType {
        backend,
        key: key.as_str().to_owned(),
        detail: "a value that is not a double barrier's members".to_owned(),
    })?;
    Ok((members, Some(read.version)))
}

/// Writes `members` if the version is still `version`; whether it was written.
pub(super) async fn write(
    values: &dyn ValueStore,
    key: &LockName,
    version: Option<u64>,
    members: &Members,
) -> Result<bool> {
    let expect = Expect::from_read(version);
    Ok(values.put(key, expect, &members.encode()).await?.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_read_back_as_written() {
        let members = Members {
            participants: 3,
            ready: true,
            ids: vec!["a1".into(), "b2".into()],
        };
        assert_eq!(Members::decode(&members.encode()), Some(members));
        assert_eq!(
            Members::decode(&Members::default().encode()),
            Some(Members::default())
        );
    }

    #[test]
    fn a_foreign_value_is_not_members() {
        for bytes in [&b""[..], b"7", b"dlb1", b"dlb1 x open", b"dlb1 3 maybe\n"] {
            assert_eq!(Members::decode(bytes), None);
        }
    }

    #[test]
    fn the_last_removal_ends_the_round() {
        let mut members = Members {
            participants: 2,
            ready: true,
            ids: vec!["a".into()],
        };
        assert!(members.remove("a"));
        assert_eq!(members, Members::default());
        assert!(!members.remove("a"));
    }
}
