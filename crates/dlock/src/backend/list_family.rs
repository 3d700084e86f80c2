//! The kinds of lock a store lists in turn when it keeps each kind in its own key space
//! (Redis, etcd): mutexes, then native semaphores, then native read-write locks. A page's
//! cursor is the family's letter followed by the store's own position within it.

#![cfg_attr(not(dlock_all_backends), allow(dead_code, unused_imports))]

/// One kind of lock in a listing, in listing order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListFamily {
    Mutexes,
    Semaphores,
    RwLocks,
}

impl ListFamily {
    /// Every family, in the order a listing walks them.
    pub(crate) const ALL: [ListFamily; 3] = [
        ListFamily::Mutexes,
        ListFamily::Semaphores,
        ListFamily::RwLocks,
    ];

    fn letter(self) -> char {
        match self {
            ListFamily::Mutexes => 'm',
            ListFamily::Semaphores => 's',
            ListFamily::RwLocks => 'r',
        }
    }

    /// A page's cursor: where the listing goes on. `position` is the store's place within
    /// this family (a `SCAN` cursor, the last name listed); `None` when the family is done,
    /// and then the cursor names the next family, or is `None` when every family is done.
    pub(crate) fn cursor(self, position: Option<&str>) -> Option<String> {
        match position {
            Some(position) => Some(format!("{}{position}", self.letter())),
            None => {
                let at = ListFamily::ALL.iter().position(|f| *f == self)?;
                let next = ListFamily::ALL.get(at + 1)?;
                Some(next.letter().to_string())
            }
        }
    }

    /// Reads a cursor made by [`cursor`](ListFamily::cursor): the family and the position
    /// within it (empty at the family's start). No cursor starts with the mutexes.
    pub(crate) fn parse(cursor: Option<&str>) -> (ListFamily, &str) {
        let Some(cursor) = cursor else {
            return (ListFamily::Mutexes, "");
        };
        let mut chars = cursor.chars();
        let family = match chars.next() {
            Some('s') => ListFamily::Semaphores,
            Some('r') => ListFamily::RwLocks,
            _ => ListFamily::Mutexes,
        };
        (family, chars.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_walk_every_family_in_turn() {
        assert_eq!(ListFamily::parse(None), (ListFamily::Mutexes, ""));
        let within = ListFamily::Semaphores.cursor(Some("a/b")).unwrap();
        assert_eq!(
            ListFamily::parse(Some(&within)),
            (ListFamily::Semaphores, "a/b")
        );
        let next = ListFamily::Mutexes.cursor(None).unwrap();
        assert_eq!(ListFamily::parse(Some(&next)), (ListFamily::Semaphores, ""));
        assert_eq!(ListFamily::RwLocks.cursor(None), None);
    }
}
