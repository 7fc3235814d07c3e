//! A topic's upstream lineage: the clusters its data came through, oldest first, each with the
//! mirror epoch of the kmirror that copied it from there (issue 14 item 3).
//!
//! A → kmirror B → kmirror C gives C the chain `A@eB, B@eC`: A's cluster id with B's mirror
//! epoch, then B's cluster id with C's. A kmirror tells its downstream the chain of each topic
//! it serves as the read-only topic config `kmirror.lineage` in DescribeConfigs (so stock
//! `kafka-configs.sh --describe` shows it too); a stock Kafka source has no such config and the
//! chain starts there. The downstream records its source's chain plus its own link at `start`,
//! at every source sync and at `repoint` (`merged`), keeps it with the topic's copied configs
//! in `__mirror_state`, and never copies `kmirror.lineage` as a topic config.
//!
//! Wire form: links joined by `,`, each `<cluster id>:<mirror epoch>` (a cluster id is
//! base64url, so it holds neither character; a source that told no cluster id is empty).
//!
//! A re-point uses it where the bytes cannot tell (`repoint_refusal`): a new source whose
//! chain holds our own cluster id mirrors the topic from us (its bytes equal ours, yet
//! following it would make a loop), and a new source whose chain shares no cluster with ours
//! is refused when our log has no batch to compare.

use serde::{Deserialize, Serialize};

use crate::control::topic_configs::SourceConfigEntry;
use crate::limits::{LINEAGE_CLUSTER_ID_CHARS_MAX, LINEAGE_HOPS_MAX};

/// The topic config a kmirror serves its lineage under.
pub const LINEAGE_CONFIG: &str = "kmirror.lineage";

/// One hop: data came from `cluster_id`, copied by a kmirror under `mirror_epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub cluster_id: Option<String>,
    pub mirror_epoch: i32,
}

impl std::fmt::Display for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}@{}",
            self.cluster_id.as_deref().unwrap_or("(no cluster id)"),
            self.mirror_epoch
        )
    }
}

/// A chain as the operator reads it: `A@1 > B@3`.
pub fn show(chain: &[Link]) -> String {
    chain
        .iter()
        .map(Link::to_string)
        .collect::<Vec<_>>()
        .join(" > ")
}

/// The wire form served as `kmirror.lineage`.
pub fn encode(chain: &[Link]) -> String {
    chain
        .iter()
        .map(|l| {
            format!(
                "{}:{}",
                l.cluster_id.as_deref().unwrap_or(""),
                l.mirror_epoch
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A `kmirror.lineage` value a source sent, checked: it comes from outside.
pub fn parse(value: &str) -> Result<Vec<Link>, String> {
    if value.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for part in value.split(',') {
        if out.len() == LINEAGE_HOPS_MAX {
            return Err(format!("more than {LINEAGE_HOPS_MAX} links"));
        }
        let (id, epoch) = part
            .trim()
            .rsplit_once(':')
            .ok_or_else(|| format!("link {part:?} is not <cluster id>:<mirror epoch>"))?;
        let mirror_epoch = epoch
            .parse::<i32>()
            .ok()
            .filter(|e| *e >= 0)
            .ok_or_else(|| format!("link {part:?} has no mirror epoch"))?;
        let good = id.len() <= LINEAGE_CLUSTER_ID_CHARS_MAX
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !good {
            return Err(format!("link {part:?} has no valid cluster id"));
        }
        out.push(Link {
            cluster_id: (!id.is_empty()).then(|| id.to_owned()),
            mirror_epoch,
        });
    }
    Ok(out)
}

/// The source's chain of a topic from its DescribeConfigs entries: empty from a stock Kafka
/// source (no `kmirror.lineage`), `Err` for a value that does not parse.
pub fn upstream_of(entries: &[SourceConfigEntry]) -> Result<Vec<Link>, String> {
    match entries.iter().find(|e| e.name == LINEAGE_CONFIG) {
        None => Ok(Vec::new()),
        Some(e) => parse(e.value.as_deref().unwrap_or(""))
            .map_err(|why| format!("the source's {LINEAGE_CONFIG} is not a lineage: {why}")),
    }
}

/// `stored` updated with what the source tells now: its chain's links we do not hold yet go
/// before our own link, which is kept while we follow the same source cluster and added when
/// the source is another one (a re-point). Links are never dropped but by the bound (oldest
/// first), so the chain shows every cluster the data came through.
pub fn merged(
    stored: &[Link],
    upstream: &[Link],
    source_cluster_id: Option<&str>,
    mirror_epoch: i32,
) -> Vec<Link> {
    let mut out = stored.to_vec();
    let same_source = out
        .last()
        .is_some_and(|l| l.cluster_id.as_deref() == source_cluster_id);
    let own = if same_source {
        out.pop().expect("checked above")
    } else {
        Link {
            cluster_id: source_cluster_id.map(str::to_owned),
            mirror_epoch,
        }
    };
    for l in upstream {
        if !out.contains(l) {
            out.push(l.clone());
        }
    }
    out.push(own);
    if out.len() > LINEAGE_HOPS_MAX {
        out.drain(..out.len() - LINEAGE_HOPS_MAX);
    }
    out
}

/// The lineage half of a re-point's check of one topic, or `None` when the lineage does not
/// object. `ours`: our chain of the topic; `own_id`: our own cluster id (when we serve);
/// `theirs`: the new source's chain of the topic; `their_id`: its cluster id;
/// `bytes_compared`: whether the history check compared a batch of ours with the source's.
pub fn repoint_refusal(
    ours: &[Link],
    own_id: Option<&str>,
    theirs: &[Link],
    their_id: Option<&str>,
    bytes_compared: bool,
) -> Option<String> {
    if let Some(own) = own_id {
        if their_id == Some(own) {
            return Some(format!(
                "the new source is this kmirror itself (cluster id {own})"
            ));
        }
        if theirs.iter().any(|l| l.cluster_id.as_deref() == Some(own)) {
            return Some(format!(
                "the new source mirrors this topic from us (its lineage {} holds our cluster id {own}): following it would make a loop",
                show(theirs)
            ));
        }
    }
    if bytes_compared || ours.is_empty() {
        return None;
    }
    let known = |id: Option<&str>| {
        id.is_some_and(|id| ours.iter().any(|l| l.cluster_id.as_deref() == Some(id)))
    };
    if known(their_id) || theirs.iter().any(|l| known(l.cluster_id.as_deref())) {
        return None;
    }
    Some(format!(
        "our log holds no batch to compare and the new source's lineage ({}{}) shares no cluster with ours ({})",
        their_id.unwrap_or("(no cluster id)"),
        if theirs.is_empty() {
            String::new()
        } else {
            format!(" from {}", show(theirs))
        },
        show(ours)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(id: &str, e: i32) -> Link {
        Link {
            cluster_id: Some(id.into()),
            mirror_epoch: e,
        }
    }

    #[test]
    fn the_wire_form_round_trips_and_foreign_values_are_refused() {
        let chain = vec![
            l("AAAA-_b", 1),
            Link {
                cluster_id: None,
                mirror_epoch: 0,
            },
            l("B", 7),
        ];
        let wire = encode(&chain);
        assert_eq!(wire, "AAAA-_b:1,:0,B:7");
        assert_eq!(parse(&wire).unwrap(), chain);
        assert_eq!(parse("").unwrap(), Vec::new());
        for bad in ["A", "A:x", "A:-1", "a b:1", "A:1,,B:2"] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
        let long = vec!["A:1"; LINEAGE_HOPS_MAX + 1].join(",");
        assert!(parse(&long).unwrap_err().contains("more than"));
        let entries = [SourceConfigEntry {
            name: LINEAGE_CONFIG.into(),
            value: Some("A:1".into()),
            source: 1,
        }];
        assert_eq!(upstream_of(&entries).unwrap(), vec![l("A", 1)]);
        assert_eq!(upstream_of(&[]).unwrap(), Vec::new());
    }

    #[test]
    fn merging_keeps_every_cluster_and_adds_a_link_per_new_source() {
        // Start of C from B, which got the topic from A under its epoch 1.
        let c = merged(&[], &[l("A", 1)], Some("B"), 3);
        assert_eq!(c, vec![l("A", 1), l("B", 3)]);
        // A sync later, C's epoch bumped: nothing changes while C follows B.
        assert_eq!(merged(&c, &[l("A", 1)], Some("B"), 4), c);
        // B was re-pointed at A2: its new link goes before C's own.
        assert_eq!(
            merged(&c, &[l("A", 1), l("A2", 2)], Some("B"), 4),
            vec![l("A", 1), l("A2", 2), l("B", 3)]
        );
        // C re-pointed straight at A (a stock source): B stays in the chain.
        assert_eq!(
            merged(&c, &[], Some("A"), 5),
            vec![l("A", 1), l("B", 3), l("A", 5)]
        );
        // A stock source at start.
        assert_eq!(merged(&[], &[], Some("A"), 0), vec![l("A", 0)]);
        let mut long = Vec::new();
        for e in 0..(LINEAGE_HOPS_MAX as i32 + 5) {
            long = merged(&long, &[], Some(&format!("c{e}")), e);
        }
        assert_eq!(long.len(), LINEAGE_HOPS_MAX);
        assert_eq!(
            long.last(),
            Some(&l(
                &format!("c{}", LINEAGE_HOPS_MAX + 4),
                LINEAGE_HOPS_MAX as i32 + 4
            ))
        );
    }

    #[test]
    fn a_loop_is_refused_always_and_a_stranger_only_without_bytes() {
        let ours = [l("A", 1), l("B", 3)];
        // C re-pointed at D, which mirrors from C: bytes agree, the lineage does not.
        let why = repoint_refusal(
            &ours,
            Some("C"),
            &[l("A", 1), l("B", 3), l("C", 2)],
            Some("D"),
            true,
        )
        .unwrap();
        assert!(
            why.contains("mirrors this topic from us") && why.contains("loop"),
            "{why}"
        );
        assert!(repoint_refusal(&ours, Some("C"), &[], Some("C"), true)
            .unwrap()
            .contains("this kmirror itself"));
        // Back to A (stock), or at another mirror of A: fine with or without bytes.
        assert_eq!(
            repoint_refusal(&ours, Some("C"), &[], Some("A"), false),
            None
        );
        assert_eq!(
            repoint_refusal(&ours, Some("C"), &[l("A", 2)], Some("B2"), false),
            None
        );
        // A stranger: refused only when no batch was compared.
        let why = repoint_refusal(&ours, Some("C"), &[], Some("X"), false).unwrap();
        assert!(
            why.contains("shares no cluster with ours (A@1 > B@3)"),
            "{why}"
        );
        assert_eq!(
            repoint_refusal(&ours, Some("C"), &[], Some("X"), true),
            None
        );
        // Nothing recorded (a mirror from before lineage): the lineage cannot object.
        assert_eq!(repoint_refusal(&[], None, &[], Some("X"), false), None);
    }
}
