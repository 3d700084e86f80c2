//! The names of the exclusive locks a composed primitive is made of, built and read in one
//! place: the primitives build them here, and tools that list a store (`dlock ls`, `dlock
//! serve`) read them back with [`ComposedPart::parse`] to show each primitive as one entry.

use std::fmt;

/// One of the exclusive locks a composed semaphore or read-write lock is made of, on stores
/// without native ones. Its lock name is `<name>#<part>`, the primitive's name and this part.
///
/// ```
/// use dlock::ComposedPart;
///
/// assert_eq!(
///     ComposedPart::parse("quota#p2of3"),
///     Some(("quota", ComposedPart::PermitSlot { slot: 2, permits: 3 }))
/// );
/// assert_eq!(ComposedPart::parse("quota#pgate"), Some(("quota", ComposedPart::PermitGate)));
/// assert_eq!(ComposedPart::PermitGate.to_string(), "pgate");
/// assert_eq!(ComposedPart::parse("plain"), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ComposedPart {
    /// `p<slot>of<permits>`: one permit slot of a semaphore of `permits` permits.
    PermitSlot {
        /// The slot's index, `0..permits`.
        slot: u32,
        /// How many permits the semaphore has.
        permits: u32,
    },
    /// `pgate`: held by a semaphore's first waiter while it waits for a slot to free.
    PermitGate,
    /// `rwgate`: held by a read-write lock's writer, or by a reader while it enters.
    RwGate,
    /// `r<index>`: one reader's place in a read-write lock.
    ReaderPlace {
        /// The place's index, `0..max_readers`.
        index: u32,
    },
}

impl ComposedPart {
    /// The primitive's name and the part, when `name` has one of the composed forms (the
    /// primitive's name not empty); `None` for any other name.
    pub fn parse(name: &str) -> Option<(&str, ComposedPart)> {
        let (base, suffix) = name.rsplit_once('#')?;
        if base.is_empty() {
            return None;
        }
        let number = |s: &str| {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<u32>().ok())
                .flatten()
        };
        let part = match suffix {
            "pgate" => ComposedPart::PermitGate,
            "rwgate" => ComposedPart::RwGate,
            _ => {
                if let Some(index) = suffix.strip_prefix('r').and_then(number) {
                    ComposedPart::ReaderPlace { index }
                } else {
                    let (slot, permits) = suffix.strip_prefix('p')?.split_once("of")?;
                    ComposedPart::PermitSlot {
                        slot: number(slot)?,
                        permits: number(permits)?,
                    }
                }
            }
        };
        Some((base, part))
    }
}

impl fmt::Display for ComposedPart {
    /// The part's suffix, as it follows the `#` in the lock's name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ComposedPart::PermitSlot { slot, permits } => write!(f, "p{slot}of{permits}"),
            ComposedPart::PermitGate => f.write_str("pgate"),
            ComposedPart::RwGate => f.write_str("rwgate"),
            ComposedPart::ReaderPlace { index } => write!(f, "r{index}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ComposedPart;

    #[test]
    fn every_part_reads_back_as_itself() {
        for part in [
            ComposedPart::PermitSlot {
                slot: 0,
                permits: 1,
            },
            ComposedPart::PermitSlot {
                slot: 63,
                permits: 64,
            },
            ComposedPart::PermitGate,
            ComposedPart::RwGate,
            ComposedPart::ReaderPlace { index: 0 },
            ComposedPart::ReaderPlace { index: 4095 },
        ] {
            let name = format!("orders/42#{part}");
            assert_eq!(
                ComposedPart::parse(&name),
                Some(("orders/42", part)),
                "{name}"
            );
        }
    }

    #[test]
    fn names_that_only_look_like_parts_are_not_parts() {
        for name in [
            "plain",
            "#rwgate",
            "#pgate",
            "a#r",
            "a#rx",
            "a#p1",
            "a#p1of",
            "a#pof3",
            "a#x",
            "a#r-1",
            "a#p1of99999999999",
            "a#gate",
        ] {
            assert_eq!(ComposedPart::parse(name), None, "{name}");
        }
    }

    #[test]
    fn the_last_hash_separates_the_part() {
        assert_eq!(
            ComposedPart::parse("a#b#r2"),
            Some(("a#b", ComposedPart::ReaderPlace { index: 2 }))
        );
    }
}
