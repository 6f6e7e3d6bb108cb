//! Server-side assignors: from the members' subscriptions and the topics'
//! partition counts to a target assignment (which member should own which
//! partition). Pure functions, deterministic (members and partitions are
//! visited in sorted order), no randomness.
//!
//! - `uniform` (the default): balances all subscribed partitions over the members
//!   (counts differ by at most one when subscriptions are equal) and is sticky:
//!   a partition stays with its current owner while that keeps the balance, so a
//!   member joining or leaving moves only the partitions that must move.
//! - `range`: per topic, the members subscribed to it (sorted by member id) get
//!   contiguous ranges of its partitions, the first `n % k` one more. Not sticky,
//!   but co-partitioned topics land on the same member.
//!
//! Invariant (checked in tests): every partition of a subscribed topic is in
//! exactly one member's target, and only in that of a member subscribed to it.

use std::collections::{BTreeMap, BTreeSet};

/// A partition: (topic, partition index).
pub type Tp = (String, u32);

/// The assignor names a group may use.
pub const ASSIGNORS: [&str; 2] = ["uniform", "range"];
/// The assignor used when a member names none.
pub const DEFAULT_ASSIGNOR: &str = "uniform";

/// One member as the assignor sees it.
#[derive(Debug, Clone)]
pub struct MemberSpec<'a> {
    pub member_id: &'a str,
    pub topics: &'a [String],
    /// What the member is (to be) assigned now, for stickiness.
    pub current: &'a BTreeSet<Tp>,
}

/// Computes the target assignment with the named assignor (one of [`ASSIGNORS`]).
pub fn assign(
    assignor: &str,
    members: &[MemberSpec<'_>],
    partition_counts: &BTreeMap<String, u32>,
) -> BTreeMap<String, BTreeSet<Tp>> {
    match assignor {
        "range" => range(members, partition_counts),
        _ => uniform(members, partition_counts),
    }
}

fn range(
    members: &[MemberSpec<'_>],
    partition_counts: &BTreeMap<String, u32>,
) -> BTreeMap<String, BTreeSet<Tp>> {
    let mut out: BTreeMap<String, BTreeSet<Tp>> = members
        .iter()
        .map(|m| (m.member_id.to_string(), BTreeSet::new()))
        .collect();
    for (topic, &count) in partition_counts {
        let mut subscribers: Vec<&str> = members
            .iter()
            .filter(|m| m.topics.iter().any(|t| t == topic))
            .map(|m| m.member_id)
            .collect();
        subscribers.sort_unstable();
        if subscribers.is_empty() {
            continue;
        }
        let k = subscribers.len() as u32;
        let (each, extra) = (count / k, count % k);
        let mut next = 0u32;
        for (i, member) in subscribers.iter().enumerate() {
            let n = each + u32::from((i as u32) < extra);
            let set = out.get_mut(*member).expect("every member has an entry");
            for p in next..next + n {
                set.insert((topic.clone(), p));
            }
            next += n;
        }
    }
    out
}

fn uniform(
    members: &[MemberSpec<'_>],
    partition_counts: &BTreeMap<String, u32>,
) -> BTreeMap<String, BTreeSet<Tp>> {
    let mut sorted: Vec<&MemberSpec<'_>> = members.iter().collect();
    sorted.sort_unstable_by_key(|m| m.member_id);
    let subscribed = |m: &MemberSpec<'_>, topic: &str| m.topics.iter().any(|t| t == topic);
    let mut all: Vec<Tp> = Vec::new();
    for (topic, &count) in partition_counts {
        if sorted.iter().any(|m| subscribed(m, topic)) {
            all.extend((0..count).map(|p| (topic.clone(), p)));
        }
    }
    let mut out: BTreeMap<String, BTreeSet<Tp>> = sorted
        .iter()
        .map(|m| (m.member_id.to_string(), BTreeSet::new()))
        .collect();
    let active = sorted.iter().filter(|m| !m.topics.is_empty()).count();
    if active == 0 {
        return out;
    }
    let floor = all.len() / active;
    let mut ceil_slots = all.len() % active;
    let mut taken: BTreeSet<&Tp> = BTreeSet::new();

    // Sticky pass: members keep what they have, up to their quota.
    for m in &sorted {
        let set = out.get_mut(m.member_id).expect("entry");
        for tp in m.current {
            if !subscribed(m, &tp.0)
                || tp.1 >= partition_counts.get(&tp.0).copied().unwrap_or(0)
                || taken.contains(tp)
            {
                continue;
            }
            if set.len() < floor {
                set.insert(tp.clone());
                taken.insert(tp);
            } else if set.len() == floor && ceil_slots > 0 {
                ceil_slots -= 1;
                set.insert(tp.clone());
                taken.insert(tp);
            }
        }
    }
    // Fill: each free partition to the eligible member with the fewest.
    for tp in &all {
        if taken.contains(tp) {
            continue;
        }
        let best = sorted
            .iter()
            .filter(|m| subscribed(m, &tp.0))
            .min_by_key(|m| (out[m.member_id].len(), m.member_id))
            .expect("the topic has a subscriber");
        out.get_mut(best.member_id)
            .expect("entry")
            .insert(tp.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    fn check_complete(
        target: &BTreeMap<String, BTreeSet<Tp>>,
        members: &[MemberSpec<'_>],
        counts: &BTreeMap<String, u32>,
    ) {
        let mut seen = BTreeSet::new();
        for (m, set) in target {
            let spec = members.iter().find(|s| s.member_id == m).unwrap();
            for tp in set {
                assert!(spec.topics.contains(&tp.0), "{m} not subscribed to {tp:?}");
                assert!(seen.insert(tp.clone()), "{tp:?} assigned twice");
            }
        }
        for (t, n) in counts {
            if members.iter().any(|m| m.topics.contains(t)) {
                for p in 0..*n {
                    assert!(seen.contains(&(t.clone(), p)), "{t}-{p} unassigned");
                }
            }
        }
    }

    #[test]
    fn uniform_balances_and_moves_only_what_must_move() {
        let topics = vec!["t".to_string()];
        let c = counts(&[("t", 6)]);
        let empty = BTreeSet::new();
        let two = [
            MemberSpec {
                member_id: "a",
                topics: &topics,
                current: &empty,
            },
            MemberSpec {
                member_id: "b",
                topics: &topics,
                current: &empty,
            },
        ];
        let first = assign("uniform", &two, &c);
        check_complete(&first, &two, &c);
        assert_eq!(first["a"].len(), 3);
        // A third member joins: each old member gives up exactly one partition.
        let three = [
            MemberSpec {
                member_id: "a",
                topics: &topics,
                current: &first["a"],
            },
            MemberSpec {
                member_id: "b",
                topics: &topics,
                current: &first["b"],
            },
            MemberSpec {
                member_id: "c",
                topics: &topics,
                current: &empty,
            },
        ];
        let second = assign("uniform", &three, &c);
        check_complete(&second, &three, &c);
        for m in ["a", "b", "c"] {
            assert_eq!(second[m].len(), 2, "{m}");
        }
        assert!(second["a"].is_subset(&first["a"]));
        assert!(second["b"].is_subset(&first["b"]));
        // A member leaves: the survivors keep theirs and split the leaver's.
        let after = [
            MemberSpec {
                member_id: "a",
                topics: &topics,
                current: &second["a"],
            },
            MemberSpec {
                member_id: "c",
                topics: &topics,
                current: &second["c"],
            },
        ];
        let third = assign("uniform", &after, &c);
        check_complete(&third, &after, &c);
        assert!(second["a"].is_subset(&third["a"]));
        assert!(second["c"].is_subset(&third["c"]));
        assert_eq!(third["a"].len(), 3);
    }

    #[test]
    fn range_gives_contiguous_ranges_per_topic_and_respects_subscriptions() {
        let both = vec!["t".to_string(), "u".to_string()];
        let only_t = vec!["t".to_string()];
        let empty = BTreeSet::new();
        let c = counts(&[("t", 5), ("u", 2), ("v", 4)]);
        let members = [
            MemberSpec {
                member_id: "b",
                topics: &both,
                current: &empty,
            },
            MemberSpec {
                member_id: "a",
                topics: &only_t,
                current: &empty,
            },
        ];
        let target = assign("range", &members, &c);
        check_complete(&target, &members, &c);
        let a: Vec<Tp> = target["a"].iter().cloned().collect();
        assert_eq!(a, vec![("t".into(), 0), ("t".into(), 1), ("t".into(), 2)]);
        assert!(target["b"].contains(&("u".to_string(), 0)));
        assert!(target["b"].contains(&("u".to_string(), 1)));
        // Uniform with mixed subscriptions still assigns everything once.
        let u = assign("uniform", &members, &c);
        check_complete(&u, &members, &c);
    }
}
