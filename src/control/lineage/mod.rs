//! Lineage of a mirror, and re-pointing it at another source without copying again.
//!
//! A mirror's lineage is the list of sources its topics came through, oldest first: each hop
//! the source's cluster id (a kmirror source tells its own, `serve::cluster_id`), its
//! bootstrap servers, and the mirror epoch and wall-clock time when kmirror left it; the
//! current source ends the list.
//! It is kept in the mirror's `__mirror_state` record (type 100), so it survives restarts, and
//! shown by `mirrors list --json` and `describe --json` (`lineage`).
//!
//! `mirrors repoint` moves a mirror to a new source (its own connection properties): every
//! partition that is not STOPPED must pass the history check (`agreement`): the new source
//! holds our last batch byte for byte at the same offsets and its leader epochs do not cut our
//! log. Then the mirror's source is replaced, a hop is added, and each partition resumes from
//! its local log end: nothing below it is fetched again. If any partition fails the check the
//! whole re-point is refused with every partition's reason and nothing changes (no log is
//! truncated, no state written): the mirror keeps its old source.

pub mod agreement;
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
