//! Validation of topic changes: create, alter configs, delete — each a pure
//! function of the request, the committed metadata image and the broker's
//! topic defaults, so the same rules hold on every broker and are unit-tested
//! without a runtime, a disk or a quorum.
//!
//! A change that passes is proposed to the quorum; the state machine checks again
//! what may have changed in between (the topic appeared, or went).

use super::image::{Command, MetadataImage, assign_replicas};
use crate::config::PARTITIONS_PER_TOPIC_MAX;
use crate::topic_configs::{self, TopicDefaults, TopicSettings};
use crate::topics::{TopicSpec, validate_topic_name};
use rill_proto::wire::{ErrorCode, ErrorInfo};
use std::collections::BTreeMap;

fn unknown_topic(name: &str) -> ErrorInfo {
    ErrorInfo::new(
        ErrorCode::UnknownTopicOrPartition,
        format!("topic {name:?} does not exist"),
    )
}

/// POLICY_VIOLATION if adding `assignment`'s replicas would give a broker more
/// partition logs than `partitions_max` (this broker's open-file limit, taken
/// for every broker's).
fn check_open_files(
    topic: &str,
    image: &MetadataImage,
    assignment: &[Vec<i32>],
    partitions_max: Option<u64>,
) -> Result<(), ErrorInfo> {
    let Some(max) = partitions_max else {
        return Ok(());
    };
    let mut held: BTreeMap<i32, u64> = BTreeMap::new();
    for p in image.topics.values().flat_map(|t| &t.partitions) {
        for b in &p.replicas {
            *held.entry(*b).or_default() += 1;
        }
    }
    let mut added: BTreeMap<i32, u64> = BTreeMap::new();
    for b in assignment.iter().flatten() {
        *added.entry(*b).or_default() += 1;
    }
    for (broker, more) in added {
        let has = held.get(&broker).copied().unwrap_or(0);
        if has + more > max {
            return Err(ErrorInfo::new(
                ErrorCode::PolicyViolation,
                format!(
                    "topic {topic}: broker {broker} holds {has} partition replicas and {more} more \
                     would pass the {max} that the broker's open-file limit allows (RLIMIT_NOFILE \
                     {} less {} reserved; a broker keeps a log with a file open for every \
                     partition it is a replica of): raise the limit on every broker (ulimit -n, \
                     or LimitNOFILE= under systemd), add brokers, or delete topics",
                    max * crate::open_files::DESCRIPTORS_PER_PARTITION
                        + crate::open_files::DESCRIPTORS_RESERVED,
                    crate::open_files::DESCRIPTORS_RESERVED,
                ),
            ));
        }
    }
    Ok(())
}

/// Checks a new topic against the image and returns the command that creates
/// it, with its replicas spread over the live brokers, under topic id `id`.
/// `partitions_max`: the partition replicas one broker may hold under this
/// broker's open-file limit ([`crate::open_files`]; a broker keeps a log, with a
/// file open, for every partition it is a replica of), `None` when unlimited.
pub fn validate_create(
    spec: &TopicSpec,
    id: String,
    image: &MetadataImage,
    defaults: &TopicDefaults,
    partitions_max: Option<u64>,
) -> Result<Command, ErrorInfo> {
    validate_topic_name(&spec.name, spec.internal)?;
    if spec.partitions == 0 || spec.partitions > PARTITIONS_PER_TOPIC_MAX {
        return Err(ErrorInfo::new(
            ErrorCode::InvalidPartitions,
            format!(
                "topic {}: partition count {} is not valid; use 1 to {PARTITIONS_PER_TOPIC_MAX}",
                spec.name, spec.partitions
            ),
        ));
    }
    if spec.replication_factor == 0 {
        return Err(ErrorInfo::new(
            ErrorCode::InvalidReplicationFactor,
            format!("topic {}: replication factor must be at least 1", spec.name),
        ));
    }
    let configs: BTreeMap<String, String> = spec.configs.iter().cloned().collect();
    TopicSettings::resolve(defaults, &configs)
        .map_err(|e| ErrorInfo::new(e.code, format!("topic {}: {}", spec.name, e.message)))?;
    if image.topics.contains_key(&spec.name) {
        return Err(ErrorInfo::new(
            ErrorCode::TopicAlreadyExists,
            format!("topic {:?} already exists", spec.name),
        ));
    }
    place_new_topic(spec, id, configs, image, partitions_max)
}

/// [`validate_create`] but for the name being free in `image`: for a broker
/// whose image may be behind a delete the quorum committed (the quorum
/// refuses a real duplicate when it applies the command). The other checks
/// count the stale topic's partitions too, which errs on the safe side.
pub fn validate_create_if_deleted(
    spec: &TopicSpec,
    id: String,
    image: &MetadataImage,
    defaults: &TopicDefaults,
    partitions_max: Option<u64>,
) -> Result<Command, ErrorInfo> {
    // "Already exists" comes after every check of the request itself, so
    // it means they passed: go on to the placement.
    match validate_create(spec, id.clone(), image, defaults, partitions_max) {
        Err(e) if e.code == ErrorCode::TopicAlreadyExists => {
            let configs = spec.configs.iter().cloned().collect();
            place_new_topic(spec, id, configs, image, partitions_max)
        }
        other => other,
    }
}

fn place_new_topic(
    spec: &TopicSpec,
    id: String,
    configs: BTreeMap<String, String>,
    image: &MetadataImage,
    partitions_max: Option<u64>,
) -> Result<Command, ErrorInfo> {
    let assignment = assign_replicas(
        &image.live_brokers(),
        spec.partitions,
        spec.replication_factor,
        image.topics.len(),
    )
    .map_err(|e| {
        ErrorInfo::new(
            ErrorCode::InvalidReplicationFactor,
            format!("topic {}: {e}", spec.name),
        )
    })?;
    check_open_files(&spec.name, image, &assignment, partitions_max)?;
    Ok(Command::CreateTopic {
        name: spec.name.clone(),
        id,
        internal: spec.internal,
        configs,
        assignment,
    })
}

/// Checks raising `name`'s partition count to `count` and returns the
/// command that adds them: replicas as many as the topic's first partition
/// has, spread over the live brokers after the existing ones.
pub fn validate_create_partitions(
    name: &str,
    count: u32,
    image: &MetadataImage,
    partitions_max: Option<u64>,
) -> Result<Command, ErrorInfo> {
    let Some(t) = image.topics.get(name) else {
        return Err(ErrorInfo::new(
            ErrorCode::UnknownTopicOrPartition,
            format!("topic {name:?} does not exist"),
        ));
    };
    if t.internal {
        return Err(ErrorInfo::new(
            ErrorCode::InvalidRequest,
            format!("{name} is an internal topic; its partition count is the broker's"),
        ));
    }
    let have = t.partitions.len() as u32;
    if count <= have || count > PARTITIONS_PER_TOPIC_MAX {
        return Err(ErrorInfo::new(
            ErrorCode::InvalidPartitions,
            format!(
                "topic {name} has {have} partitions; the count can only grow, to at most \
                 {PARTITIONS_PER_TOPIC_MAX} (asked for {count})"
            ),
        ));
    }
    let rf = t.partitions.first().map_or(1, |p| p.replicas.len()) as u16;
    let assignment = assign_replicas(&image.live_brokers(), count - have, rf, have as usize)
        .map_err(|e| {
            ErrorInfo::new(
                ErrorCode::InvalidReplicationFactor,
                format!("topic {name}: {e}"),
            )
        })?;
    check_open_files(name, image, &assignment, partitions_max)?;
    Ok(Command::CreatePartitions {
        name: name.to_string(),
        assignment,
    })
}

/// Checks a config change of a topic and returns its new overrides.
pub fn validate_alter(
    topic: &str,
    set: &[(String, String)],
    delete: &[String],
    image: &MetadataImage,
    defaults: &TopicDefaults,
) -> Result<BTreeMap<String, String>, ErrorInfo> {
    let t = image
        .topics
        .get(topic)
        .ok_or_else(|| unknown_topic(topic))?;
    let mut overrides = t.configs.clone();
    for key in delete {
        if topic_configs::lookup(key).is_none() {
            return Err(ErrorInfo::new(
                ErrorCode::InvalidConfig,
                format!(
                    "topic {topic}: cannot delete unknown config {key:?}; known keys are {}",
                    topic_configs::known_keys()
                ),
            ));
        }
        overrides.remove(key);
    }
    for (k, v) in set {
        overrides.insert(k.clone(), v.clone());
    }
    TopicSettings::resolve(defaults, &overrides)
        .map_err(|e| ErrorInfo::new(e.code, format!("topic {topic}: {}", e.message)))?;
    Ok(overrides)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::image::{BrokerRecord, Outcome};

    fn defaults() -> TopicDefaults {
        TopicDefaults::kafka()
    }

    /// An image with brokers 0..n (broker `fenced` fenced) and topic "t".
    fn image(brokers: i32, fenced: Option<i32>) -> MetadataImage {
        let mut image = MetadataImage::default();
        for id in 0..brokers {
            image.brokers.insert(
                id,
                BrokerRecord {
                    id,
                    addr: String::new(),
                    fenced: fenced == Some(id),
                    listeners: Default::default(),
                },
            );
        }
        let create = validate_create(
            &spec("t", 2, 1, &[]),
            "id-t".into(),
            &image,
            &defaults(),
            None,
        )
        .unwrap();
        image.apply(&create);
        image
    }

    fn spec(name: &str, partitions: u32, rf: u16, configs: &[(&str, &str)]) -> TopicSpec {
        TopicSpec {
            name: name.into(),
            partitions,
            replication_factor: rf,
            configs: configs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            internal: false,
        }
    }

    fn create_error(s: TopicSpec, image: &MetadataImage) -> ErrorInfo {
        validate_create(&s, "id".into(), image, &defaults(), None).unwrap_err()
    }

    #[test]
    fn create_past_the_open_file_limit_is_refused_naming_it() {
        // The image holds topic "t" with 2 partitions of one replica each.
        let image = image(3, None);
        let ok = validate_create(
            &spec("u", 8, 3, &[]),
            "id-u".into(),
            &image,
            &defaults(),
            Some(10),
        );
        assert!(ok.is_ok(), "{ok:?}");
        let e = validate_create(
            &spec("u", 10, 3, &[]),
            "id-u".into(),
            &image,
            &defaults(),
            Some(10),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::PolicyViolation);
        assert!(e.message.contains("RLIMIT_NOFILE"), "{}", e.message);
        assert!(
            e.message.contains("holds 1 partition replicas"),
            "{}",
            e.message
        );
        // The limit is per broker: with one replica each, three brokers hold
        // three times as many partitions as one.
        let ok = validate_create(
            &spec("v", 24, 1, &[]),
            "id-v".into(),
            &image,
            &defaults(),
            Some(10),
        );
        assert!(ok.is_ok(), "{ok:?}");
        let e = validate_create(
            &spec("v", 30, 1, &[]),
            "id-v".into(),
            &image,
            &defaults(),
            Some(10),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::PolicyViolation, "{}", e.message);
    }

    #[test]
    fn create_spreads_replicas_over_live_brokers() {
        let image = image(3, None);
        let Command::CreateTopic {
            assignment,
            configs,
            id,
            ..
        } = validate_create(
            &spec("u", 6, 3, &[("retention.ms", "5")]),
            "id-u".into(),
            &image,
            &defaults(),
            None,
        )
        .unwrap()
        else {
            panic!("not a create")
        };
        assert_eq!(id, "id-u");
        assert_eq!(configs.get("retention.ms").map(String::as_str), Some("5"));
        assert_eq!(assignment.len(), 6);
        for replicas in &assignment {
            let mut sorted = replicas.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 1, 2]);
        }
        // Preferred leaders rotate.
        let leaders: std::collections::BTreeSet<i32> = assignment.iter().map(|r| r[0]).collect();
        assert_eq!(leaders.len(), 3);
    }

    #[test]
    fn partitions_only_grow_with_the_topics_replication_factor() {
        let mut image = image(3, None);
        let create = validate_create(
            &spec("u", 2, 2, &[]),
            "id-u".into(),
            &image,
            &defaults(),
            None,
        )
        .unwrap();
        image.apply(&create);
        let add = validate_create_partitions("u", 5, &image, None).unwrap();
        let Command::CreatePartitions { assignment, .. } = &add else {
            panic!("not a CreatePartitions: {add:?}")
        };
        assert_eq!(assignment.len(), 3);
        assert!(assignment.iter().all(|r| r.len() == 2), "{assignment:?}");
        assert!(!matches!(image.apply(&add), Outcome::Refused { .. }));
        let u = &image.topics["u"];
        assert_eq!(u.partitions.len(), 5);
        assert!(u.partitions[4].leader.is_some());
        let e = validate_create_partitions("u", 5, &image, None).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidPartitions);
        assert!(e.message.contains("has 5 partitions"), "{}", e.message);
        let e = validate_create_partitions("nope", 5, &image, None).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnknownTopicOrPartition);
        let e = validate_create_partitions("u", 9, &image, Some(5)).unwrap_err();
        assert_eq!(e.code, ErrorCode::PolicyViolation);
    }

    #[test]
    fn create_refuses_what_cannot_be_made_naming_why() {
        let image = image(3, Some(2));
        let cases = [
            (
                spec("t", 1, 1, &[]),
                ErrorCode::TopicAlreadyExists,
                "already exists",
            ),
            (
                spec("a b", 1, 1, &[]),
                ErrorCode::InvalidTopic,
                "not allowed",
            ),
            (spec("__x", 1, 1, &[]), ErrorCode::InvalidTopic, "reserved"),
            (
                spec("u", 0, 1, &[]),
                ErrorCode::InvalidPartitions,
                "partition count 0",
            ),
            (
                spec("u", PARTITIONS_PER_TOPIC_MAX + 1, 1, &[]),
                ErrorCode::InvalidPartitions,
                "is not valid",
            ),
            (
                spec("u", 1, 0, &[]),
                ErrorCode::InvalidReplicationFactor,
                "at least 1",
            ),
            // Two live brokers of three: RF 3 cannot be placed.
            (
                spec("u", 1, 3, &[]),
                ErrorCode::InvalidReplicationFactor,
                "topic u",
            ),
            (
                spec("u", 1, 1, &[("retention.ms", "soon")]),
                ErrorCode::InvalidConfig,
                "topic u: ",
            ),
            (
                spec("u", 1, 1, &[("no.such.key", "1")]),
                ErrorCode::InvalidConfig,
                "no.such.key",
            ),
        ];
        for (s, code, text) in cases {
            let name = s.name.clone();
            let e = create_error(s, &image);
            assert_eq!(e.code, code, "{name}: {}", e.message);
            assert!(e.message.contains(text), "{name}: {}", e.message);
        }
        // An internal topic may use the reserved prefix.
        let mut internal = spec("__consumer_offsets", 1, 2, &[]);
        internal.internal = true;
        validate_create(&internal, "i".into(), &image, &defaults(), None).unwrap();
    }

    #[test]
    fn a_create_past_a_stale_image_skips_only_the_name_check() {
        // Topic "t" exists in this (possibly stale) image; two brokers live.
        let image = image(3, Some(2));
        let again = |s: TopicSpec| {
            validate_create_if_deleted(&s, "id-t2".into(), &image, &defaults(), None)
        };
        let Command::CreateTopic { name, id, .. } = again(spec("t", 2, 2, &[])).unwrap() else {
            panic!("not a create");
        };
        assert_eq!((name.as_str(), id.as_str()), ("t", "id-t2"));
        // Every other check still holds.
        let e = again(spec("t", 1, 3, &[])).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidReplicationFactor, "{}", e.message);
        let e = again(spec("t", 1, 1, &[("retention.ms", "soon")])).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig, "{}", e.message);
        let e = again(spec("t", 0, 1, &[])).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidPartitions, "{}", e.message);
    }

    #[test]
    fn alter_returns_the_new_overrides_or_names_the_bad_one() {
        let mut image = image(1, None);
        let set = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        let overrides =
            validate_alter("t", &set("retention.ms", "100"), &[], &image, &defaults()).unwrap();
        assert_eq!(
            overrides.get("retention.ms").map(String::as_str),
            Some("100")
        );
        image.apply(&Command::SetTopicConfigs {
            name: "t".into(),
            configs: overrides,
        });
        let after =
            validate_alter("t", &[], &["retention.ms".into()], &image, &defaults()).unwrap();
        assert!(after.is_empty());
        let e =
            validate_alter("t", &[], &["retention.mss".into()], &image, &defaults()).unwrap_err();
        assert!(
            e.message
                .contains("cannot delete unknown config \"retention.mss\""),
            "{}",
            e.message
        );
        let e = validate_alter(
            "t",
            &set("min.insync.replicas", "0"),
            &[],
            &image,
            &defaults(),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig);
        assert!(e.message.starts_with("topic t: "), "{}", e.message);
        let e = validate_alter("nope", &[], &[], &image, &defaults()).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnknownTopicOrPartition);
    }

    /// Deleting needs the topic: the state machine refuses an unknown one
    /// (the only check: a broker's image may be behind the quorum's log).
    #[test]
    fn delete_needs_the_topic() {
        let mut image = image(1, None);
        assert!(matches!(
            image.apply(&Command::DeleteTopic { name: "u".into() }),
            Outcome::Refused {
                code: ErrorCode::UnknownTopicOrPartition,
                ..
            }
        ));
        assert!(matches!(
            image.apply(&Command::DeleteTopic { name: "t".into() }),
            Outcome::Done
        ));
    }
}
