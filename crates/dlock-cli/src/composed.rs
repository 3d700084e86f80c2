//! Composed primitives shown as one entry each.
//!
//! On stores without native semaphores or read-write locks, dlock composes them from plain
//! locks (see the library's `Semaphore`, `RwLock` and `ComposedPart`): permit slots
//! `<name>#p<i>of<n>` with a gate `<name>#pgate` that the first waiter holds, and a gate
//! `<name>#rwgate` with reader places `<name>#r<i>`. Listed raw, one semaphore with three
//! permits taken shows as three locks. [`fold`] turns the parts of each primitive into one
//! entry named `<name>`: kind `permit` (holds = permits taken, the gate's holder counted as a
//! waiter), `reader` (holds = readers inside) or `writer`. A plain lock whose name happens to end like a part is shown folded
//! too; `dlock ls --parts` shows the raw entries.

use std::collections::BTreeMap;

use dlock::{ComposedPart, HoldKind, LockInfo};

/// What a listed name is part of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Permit,
    /// A semaphore's gate: held by its first waiter, so a waiter rather than a holder.
    PermitGate,
    Gate,
    ReaderPlace,
}

/// The primitive's name and the part, for a name of one of the composed forms (read by the
/// library's own parser, the one that builds them).
fn part_of(name: &str) -> Option<(&str, Part)> {
    let (base, part) = ComposedPart::parse(name)?;
    let part = match part {
        ComposedPart::PermitSlot { .. } => Part::Permit,
        ComposedPart::PermitGate => Part::PermitGate,
        ComposedPart::RwGate => Part::Gate,
        ComposedPart::ReaderPlace { .. } => Part::ReaderPlace,
        _ => return None,
    };
    Some((base, part))
}

/// The same holder (a writer holds the gate and every reader place).
fn same_holder(a: &LockInfo, b: &LockInfo) -> bool {
    a.owner == b.owner
}

/// One entry for the parts of one primitive.
fn folded(base: &str, mut parts: Vec<(Part, LockInfo)>) -> LockInfo {
    parts.sort_by_key(|(_, info)| info.acquired_at);
    let gate = parts
        .iter()
        .find(|(part, _)| *part == Part::Gate)
        .map(|(_, info)| info.clone());
    let places: Vec<&LockInfo> = parts
        .iter()
        .filter(|(part, _)| *part == Part::ReaderPlace)
        .map(|(_, info)| info)
        .collect();
    let permits: Vec<&LockInfo> = parts
        .iter()
        .filter(|(part, _)| *part == Part::Permit)
        .map(|(_, info)| info)
        .collect();
    let permit_gate = parts
        .iter()
        .find(|(part, _)| *part == Part::PermitGate)
        .map(|(_, info)| info);
    let (kind, shown, holds): (HoldKind, &LockInfo, usize) = if !permits.is_empty() {
        (HoldKind::Permit, permits[0], permits.len())
    } else if let Some(gate) = permit_gate {
        // Only the gate listed: its waiter is between a slot's release and taking it.
        (HoldKind::Permit, gate, 0)
    } else if let Some(gate) = &gate
        && places.iter().all(|place| same_holder(place, gate))
    {
        // The gate alone (a writer waiting for readers to leave) or with its own places.
        (HoldKind::Writer, gate, 1)
    } else {
        // Readers inside; a gate held by someone else is a reader entering or a writer
        // waiting behind them.
        let readers: Vec<&LockInfo> = places
            .iter()
            .copied()
            .filter(|place| gate.as_ref().is_none_or(|gate| !same_holder(place, gate)))
            .collect();
        let first = readers.first().copied().unwrap_or(places[0]);
        (HoldKind::Reader, first, readers.len().max(1))
    };
    let all = parts.iter().map(|(_, info)| info);
    let ttl_left = all.clone().filter_map(|info| info.ttl_left).min();
    // The gate's holder waits for a permit too, beside those queued on the gate.
    let gate_holder = u32::from(permit_gate.is_some());
    let waiters = all
        .clone()
        .map(|info| info.waiters)
        .try_fold(gate_holder, |sum, w| w.map(|w| sum.saturating_add(w)));
    let fence = all.map(|info| info.fence).max().unwrap_or(shown.fence);
    let mut info = LockInfo::new(
        base.to_owned(),
        fence,
        shown.owner.clone(),
        shown.acquired_at,
        ttl_left,
        u32::try_from(holds).unwrap_or(u32::MAX),
    )
    .with_kind(kind);
    if let Some(waiters) = waiters {
        info = info.with_waiters(waiters);
    }
    info
}

/// The listed locks with each composed primitive's parts folded into one entry, sorted by
/// name. Entries of other kinds (native primitives, plain locks) are kept as they are.
pub(crate) fn fold(held: Vec<LockInfo>) -> Vec<LockInfo> {
    let mut out = Vec::with_capacity(held.len());
    let mut groups: BTreeMap<String, Vec<(Part, LockInfo)>> = BTreeMap::new();
    for info in held {
        match (info.kind, part_of(&info.name)) {
            (HoldKind::Mutex, Some((base, part))) => {
                let base = base.to_owned();
                groups.entry(base).or_default().push((part, info));
            }
            _ => out.push(info),
        }
    }
    out.extend(groups.into_iter().map(|(base, parts)| folded(&base, parts)));
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use dlock::{FencingToken, HoldKind, LockInfo, Owner};

    use super::fold;

    fn held(name: &str, fence: u64, pid: u32, waiters: u32) -> LockInfo {
        LockInfo::new(
            name.into(),
            FencingToken::new(fence),
            Owner::new(None, "h", pid),
            SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(pid)),
            Some(Duration::from_secs(fence)),
            1,
        )
        .with_waiters(waiters)
    }

    #[test]
    fn permits_readers_and_a_writer_become_one_entry_each() {
        let listed = vec![
            held("plain", 1, 1, 0),
            held("quota#p0of3", 5, 10, 1),
            held("quota#p2of3", 6, 11, 0),
            held("prices#r0", 7, 20, 0),
            held("prices#r3", 8, 21, 0),
            held("config#rwgate", 9, 30, 2),
            held("config#r0", 9, 30, 0),
            held("config#r1", 9, 30, 0),
        ];
        let shown = fold(listed);
        let names: Vec<&str> = shown.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["config", "plain", "prices", "quota"]);
        let by = |name: &str| shown.iter().find(|i| i.name == name).unwrap();
        assert_eq!(by("plain").kind, HoldKind::Mutex);
        assert_eq!((by("quota").kind, by("quota").holds), (HoldKind::Permit, 2));
        assert_eq!(by("quota").waiters, Some(1));
        assert_eq!(by("quota").fence.get(), 6);
        assert_eq!(by("quota").owner.pid, 10, "the earliest holder is shown");
        assert_eq!(by("quota").ttl_left, Some(Duration::from_secs(5)));
        assert_eq!(
            (by("prices").kind, by("prices").holds),
            (HoldKind::Reader, 2)
        );
        assert_eq!(
            (by("config").kind, by("config").holds),
            (HoldKind::Writer, 1)
        );
        assert_eq!(by("config").waiters, Some(2));
    }

    #[test]
    fn readers_inside_with_a_writer_waiting_at_the_gate_show_as_readers() {
        let shown = fold(vec![
            held("cfg#rwgate", 9, 40, 0),
            held("cfg#r0", 3, 41, 0),
            held("cfg#r1", 4, 42, 0),
        ]);
        assert_eq!(shown.len(), 1);
        assert_eq!((shown[0].kind, shown[0].holds), (HoldKind::Reader, 2));
        assert_eq!(shown[0].owner.pid, 41);
    }

    #[test]
    fn a_semaphores_gate_is_its_waiter_not_a_stray_lock() {
        let shown = fold(vec![
            held("quota#p0of2", 5, 10, 0),
            held("quota#p1of2", 6, 11, 0),
            held("quota#pgate", 7, 12, 2),
        ]);
        assert_eq!(shown.len(), 1, "{shown:?}");
        let quota = &shown[0];
        assert_eq!(quota.name, "quota");
        assert_eq!((quota.kind, quota.holds), (HoldKind::Permit, 2));
        assert_eq!(
            quota.owner.pid, 10,
            "a holder is shown, not the waiter at the gate"
        );
        assert_eq!(
            quota.waiters,
            Some(3),
            "the gate's holder and the two queued behind it"
        );
    }

    #[test]
    fn names_that_only_look_like_parts_are_kept() {
        for name in ["#rwgate", "a#r", "a#rx", "a#p1", "a#p1of", "a#pof3", "a#x"] {
            let shown = fold(vec![held(name, 1, 1, 0)]);
            assert_eq!(shown[0].name, name);
            assert_eq!(shown[0].kind, HoldKind::Mutex);
        }
    }
}
