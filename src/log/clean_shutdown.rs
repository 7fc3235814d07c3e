//! `.kafka_cleanshutdown`, the marker at a log-dir root that tells a broker the logs were closed
//! cleanly, so it trusts indexes and producer snapshots without recovering them (§3.6, §4 step 6).
//!
//! Kafka 3.7+ (including 4.1) writes `{"version":0,"brokerEpoch":N}` and reads it back only for
//! the broker epoch (a read failure is logged and ignored); recovery looks only at whether the
//! file exists. Older releases wrote an empty file. We write the JSON form when we have an epoch
//! and the empty form otherwise, both of which 4.1 accepts as a clean shutdown.
//!
//! Write it only when every partition in the dir has exact indexes and correct producer
//! snapshots: with the marker present and snapshots missing, Kafka silently drops producer state.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::log::checkpoint::{read_small_file, sync_dir, write_atomically};
use crate::log::LogError;

pub const FILE_NAME: &str = ".kafka_cleanshutdown";
const VERSION: i32 = 0;

#[derive(serde::Serialize, serde::Deserialize)]
struct Content {
    version: i32,
    #[serde(rename = "brokerEpoch")]
    broker_epoch: i64,
}

pub fn path(log_dir_root: &Path) -> PathBuf {
    log_dir_root.join(FILE_NAME)
}

/// Write the marker atomically (and durably: a marker that vanishes on power loss would only
/// cost a recovery, but one that appears torn must not happen).
pub fn write(log_dir_root: &Path, broker_epoch: Option<i64>) -> Result<(), LogError> {
    let content = match broker_epoch {
        Some(broker_epoch) => serde_json::to_string(&Content {
            version: VERSION,
            broker_epoch,
        })
        .expect("a struct of two integers serialises"),
        None => String::new(),
    };
    write_atomically(&path(log_dir_root), content.as_bytes())
}

pub fn exists(log_dir_root: &Path) -> Result<bool, LogError> {
    let p = path(log_dir_root);
    match fs::symlink_metadata(&p) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(LogError::io(p, e)),
    }
}

/// The broker epoch recorded in the marker, `None` when absent, empty or unreadable (Kafka also
/// treats an unreadable marker as "no epoch", not as an error).
pub fn read_broker_epoch(log_dir_root: &Path) -> Result<Option<i64>, LogError> {
    let Some(bytes) = read_small_file(&path(log_dir_root))? else {
        return Ok(None);
    };
    Ok(serde_json::from_slice::<Content>(&bytes)
        .ok()
        .map(|c| c.broker_epoch))
}

/// Remove the marker before the first write to any log in the dir, durably, so that a crash
/// afterwards makes the broker recover.
pub fn remove(log_dir_root: &Path) -> Result<(), LogError> {
    let p = path(log_dir_root);
    match fs::remove_file(&p) {
        Ok(()) => sync_dir(log_dir_root),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LogError::io(p, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_exists_remove() {
        let d = tempfile::tempdir().unwrap();
        assert!(!exists(d.path()).unwrap());
        write(d.path(), Some(42)).unwrap();
        assert!(exists(d.path()).unwrap());
        assert_eq!(
            fs::read_to_string(path(d.path())).unwrap(),
            r#"{"version":0,"brokerEpoch":42}"#
        );
        assert_eq!(read_broker_epoch(d.path()).unwrap(), Some(42));
        remove(d.path()).unwrap();
        assert!(!exists(d.path()).unwrap());
        remove(d.path()).unwrap();
        write(d.path(), None).unwrap();
        assert!(exists(d.path()).unwrap());
        assert_eq!(fs::read(path(d.path())).unwrap(), b"");
        assert_eq!(read_broker_epoch(d.path()).unwrap(), None);
    }
}
