//! The in-process wake-ups of the stores that wake their own waiters when a lock is freed
//! (SQLite and the SQL lease tables).

#![cfg_attr(not(dlock_all_backends), allow(dead_code, unused_imports))]

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::sync::watch;

/// Waiters of this process per lock name, woken by this client's releases (and, on
/// PostgreSQL, by NOTIFY from every other client; on SQLite, by the wake file).
#[derive(Debug, Default)]
pub(crate) struct Wakers {
    map: Mutex<HashMap<String, watch::Sender<()>>>,
}

impl Wakers {
    pub(crate) fn subscribe(&self, name: &str) -> watch::Receiver<()> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry(name.to_owned())
            .or_insert_with(|| watch::Sender::new(()))
            .subscribe()
    }

    pub(crate) fn wake(&self, name: &str) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = map.get(name) {
            sender.send_replace(());
            if sender.receiver_count() == 0 {
                map.remove(name);
            }
        }
    }

    /// Wakes every waiter (after a gap in which notifications may have been missed).
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) fn wake_all(&self) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, sender| {
            sender.send_replace(());
            sender.receiver_count() > 0
        });
    }

    /// How many names waiters of this process are subscribed to (forgetting names nobody
    /// waits on any more).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn waited_names(&self) -> usize {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, sender| sender.receiver_count() > 0);
        map.len()
    }
}
