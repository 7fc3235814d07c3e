//! Lineage of a mirror, and re-pointing it at another source without copying again.
//!
//! A mirror's lineage is the list of sources its topics came through, oldest first: each hop
//! the source's cluster id (a kmirror source tells its own, `serve::cluster_id`), its
//! bootstrap servers, and the mirror epoch and wall-clock time when kmirror left it; the
//! current source ends the list.
//! It is kept in the mirror's `__mirror_state` record (type 100), so it survives restarts, and
//! shown by `mirrors list --json` (`lineage`).
//!
//! Each topic also keeps its upstream chain (`chain`): every cluster its data came through,
//! with the mirror epochs, learned from a kmirror source's `kmirror.lineage` topic config and
//! served to our own downstream the same way; `mirrors describe` shows it per topic.
//!
//! `mirrors repoint` moves a mirror to a new source (its own connection properties): every
//! partition that is not STOPPED must pass the history check (`agreement`): the new source
//! holds our last batch byte for byte at the same offsets and its leader epochs do not cut our
//! log; and the topic's chain must not object (`chain::repoint_refusal`: a source that
//! mirrors the topic from us, or a stranger when there is no batch to compare). STOPPED
//! partitions are failed over: written locally, they are no longer a copy of any source, and
//! re-pointing them would be a new mirror over local writes; they stay STOPPED and the report
//! names them (failback is the way to send their writes back). Then the mirror's source is replaced, a hop is added, and each partition resumes from
//! its local log end: nothing below it is fetched again. If any partition fails the check the
//! whole re-point is refused with every partition's reason and nothing changes (no log is
//! truncated, no state written): the mirror keeps its old source.

pub mod agreement;
pub mod chain;
pub mod probe;

use serde::{Deserialize, Serialize};

pub use agreement::{agree, Agreement, LocalTail, SourceTail};

/// One source a mirror followed before it was re-pointed away from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hop {
    /// The source's cluster id as its Metadata told it (none from a source that tells none).
    pub cluster_id: Option<String>,
    pub bootstrap_servers: String,
    /// The mirror epoch in force when kmirror stopped following this source.
    pub until_mirror_epoch: i32,
    /// When (wall-clock ms) kmirror stopped following it.
    pub until_ms: i64,
}
