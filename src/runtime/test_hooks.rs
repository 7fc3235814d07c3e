//! Faults the integration tests inject into a running shard, to prove that a shard that panics
//! or hangs is detected (`runtime::health`): with `KMIRROR_TEST_PANIC_SHARD_WHEN_FILE=<path>`
//! shard 0 panics, and with `KMIRROR_TEST_STALL_SHARD_WHEN_FILE=<path>` it stops turning its
//! loop for good, once `<path>` exists. A file the test creates, rather than a delay, lets the
//! test fire the fault exactly when the mirror is where it wants it, however loaded the machine
//! is. The shard looks for the file on its heartbeat timer (every `SHARD_HEARTBEAT_MS`), never
//! on the data path.
//!
//! Read only in builds with debug assertions (what `cargo test` runs). The shipped binary is a
//! release build (`systemd/README.md` installs `target/release/kmirror`), where these variables
//! are ignored with a warning, so nothing in a production environment can trigger them by
//! accident; a config key would be one typo away from production.

use std::path::PathBuf;

use crate::ids::ShardId;

const PANIC_VAR: &str = "KMIRROR_TEST_PANIC_SHARD_WHEN_FILE";
const STALL_VAR: &str = "KMIRROR_TEST_STALL_SHARD_WHEN_FILE";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Panic,
    Stall,
}

/// A fault armed for this shard.
#[derive(Debug)]
pub(crate) struct ShardFault {
    trigger: PathBuf,
    kind: Kind,
}

fn trigger(var: &str) -> Option<PathBuf> {
    let v = std::env::var_os(var)?;
    if !cfg!(debug_assertions) {
        tracing::warn!("{var} is ignored: test hooks exist only in debug builds");
        return None;
    }
    Some(PathBuf::from(v))
}

impl ShardFault {
    /// The fault armed for `shard` (only shard 0 gets one).
    pub(crate) fn armed(shard: ShardId) -> Option<ShardFault> {
        if shard != ShardId(0) {
            return None;
        }
        let (kind, trigger) = match (trigger(PANIC_VAR), trigger(STALL_VAR)) {
            (Some(p), _) => (Kind::Panic, p),
            (None, Some(p)) => (Kind::Stall, p),
            (None, None) => return None,
        };
        tracing::warn!(shard = shard.0, ?kind, trigger = %trigger.display(), "test hook armed");
        Some(ShardFault { trigger, kind })
    }

    /// Fires the fault once its file exists: panics, or never returns.
    pub(crate) fn fire_if_due(&self, shard: ShardId) {
        if !cfg!(debug_assertions) || !self.trigger.exists() {
            return;
        }
        match self.kind {
            Kind::Panic => panic!("test hook: shard {} panics on purpose", shard.0),
            Kind::Stall => {
                tracing::warn!(shard = shard.0, "test hook: shard stops turning its loop");
                loop {
                    std::thread::park();
                }
            }
        }
    }
}
