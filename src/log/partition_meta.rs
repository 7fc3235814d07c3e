//! `partition.metadata`: the topic id of a partition directory (Kafka 2.8+, KIP-516).
//!
//! Exactly `version: 0\ntopic_id: <id>` with no trailing newline, the id being the 16 uuid bytes
//! in URL-safe base64 without padding, as Kafka's `Uuid.toString` prints it (kafka-formats.md
//! §3.7). A broker that adopts the directory compares this id with the topic's id in metadata and
//! refuses the log on a mismatch, so it must be the source topic's id.

use std::path::Path;

use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use uuid::Uuid;

use crate::log::checkpoint::{read_small_file, tmp_path, write_atomically};
use crate::log::LogError;

pub const FILE_NAME: &str = "partition.metadata";
const VERSION: i32 = 0;

/// Kafka's textual form of a uuid (22 characters).
pub fn uuid_to_kafka_string(id: Uuid) -> String {
    URL_SAFE_NO_PAD.encode(id.as_bytes())
}

/// Parse Kafka's textual uuid; Java's URL decoder also accepts the padded form.
pub fn uuid_from_kafka_string(s: &str) -> Option<Uuid> {
    let bytes = if s.ends_with('=') {
        URL_SAFE.decode(s)
    } else {
        URL_SAFE_NO_PAD.decode(s)
    };
    let bytes: [u8; 16] = bytes.ok()?.try_into().ok()?;
    Some(Uuid::from_bytes(bytes))
}

/// Write `<dir>/partition.metadata` atomically. The all-zero uuid means "no id" in Kafka and is
/// never a topic's id (Kafka would refuse to read the file back), so it is refused.
pub fn write(dir: &Path, topic_id: Uuid) -> Result<(), LogError> {
    write_atomically(&dir.join(FILE_NAME), text(dir, topic_id)?.as_bytes())
}

fn text(dir: &Path, topic_id: Uuid) -> Result<String, LogError> {
    if topic_id.is_nil() {
        return Err(LogError::corrupt(
            dir.join(FILE_NAME),
            "refusing to write the all-zero uuid as a topic id",
        ));
    }
    Ok(format!(
        "version: {VERSION}\ntopic_id: {}",
        uuid_to_kafka_string(topic_id)
    ))
}

/// The first half of `write` for a caller that makes many files durable at once
/// (`LogDir::create_missing`): the contents go to the tmp sibling, unsynced and not yet in
/// place. The caller makes them durable, then calls `publish_staged`, then makes the rename
/// durable; the file is thus absent or whole after a crash, as with `write`.
pub fn stage(dir: &Path, topic_id: Uuid) -> Result<(), LogError> {
    let tmp = tmp_path(&dir.join(FILE_NAME));
    std::fs::write(&tmp, text(dir, topic_id)?).map_err(|e| LogError::io(&tmp, e))
}

/// Renames a file `stage` wrote (and the caller made durable) into place.
pub fn publish_staged(dir: &Path) -> Result<(), LogError> {
    let path = dir.join(FILE_NAME);
    std::fs::rename(tmp_path(&path), &path).map_err(|e| LogError::io(&path, e))
}

/// Read the topic id; `None` if the file does not exist. Like Kafka, each line must split on
/// whitespace into exactly two tokens, the version must be 0 and the id must not be all zeros.
pub fn read(dir: &Path) -> Result<Option<Uuid>, LogError> {
    let path = dir.join(FILE_NAME);
    let Some(bytes) = read_small_file(&path)? else {
        return Ok(None);
    };
    let corrupt = |why: String| LogError::corrupt(&path, why);
    let text = String::from_utf8(bytes).map_err(|_| corrupt("not UTF-8".into()))?;
    let mut lines = text.lines();
    let version_line = lines.next().unwrap_or_default();
    let [_, version] = version_line.split_whitespace().collect::<Vec<_>>()[..] else {
        return Err(corrupt(format!("malformed version line {version_line:?}")));
    };
    if version.parse::<i32>().ok() != Some(VERSION) {
        return Err(corrupt(format!("unrecognised version {version:?}")));
    }
    let id_line = lines.next().unwrap_or_default();
    let [_, id] = id_line.split_whitespace().collect::<Vec<_>>()[..] else {
        return Err(corrupt(format!("malformed topic_id line {id_line:?}")));
    };
    let id = uuid_from_kafka_string(id).ok_or_else(|| corrupt(format!("bad topic id {id:?}")))?;
    if id.is_nil() {
        return Err(corrupt("topic id is the all-zero uuid".into()));
    }
    Ok(Some(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn exact_bytes_without_trailing_newline() {
        let d = tempfile::tempdir().unwrap();
        // 0x00..0x0f in URL-safe base64 without padding, worked out by hand from the alphabet.
        let id = Uuid::from_bytes([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
        write(d.path(), id).unwrap();
        let text = std::fs::read_to_string(d.path().join(FILE_NAME)).unwrap();
        assert_eq!(text, "version: 0\ntopic_id: AAECAwQFBgcICQoLDA0ODw");
        assert_eq!(read(d.path()).unwrap(), Some(id));
    }

    #[test]
    fn missing_is_none_and_bad_is_corrupt() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read(d.path()).unwrap(), None);
        let p = d.path().join(FILE_NAME);
        for bad in [
            "version: 1\ntopic_id: AAECAwQFBgcICQoLDA0ODw",
            "version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA",
            "version: 0\ntopic_id: short",
            "version: 0\ntopic_id:",
            "version: 0",
            "",
        ] {
            std::fs::write(&p, bad).unwrap();
            assert!(
                matches!(read(d.path()), Err(LogError::Corrupt { .. })),
                "{bad:?}"
            );
        }
        // Kafka accepts a trailing newline and padding; so do we.
        std::fs::write(&p, "version: 0\ntopic_id: AAECAwQFBgcICQoLDA0ODw==\n").unwrap();
        assert!(read(d.path()).unwrap().is_some());
    }

    #[test]
    fn refuses_to_write_nil_id() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(
            write(d.path(), Uuid::nil()),
            Err(LogError::Corrupt { .. })
        ));
        assert!(!d.path().join(FILE_NAME).exists());
    }

    proptest! {
        #[test]
        fn round_trips(bytes in any::<[u8; 16]>()) {
            prop_assume!(bytes != [0; 16]);
            let d = tempfile::tempdir().unwrap();
            let id = Uuid::from_bytes(bytes);
            write(d.path(), id).unwrap();
            prop_assert_eq!(read(d.path()).unwrap(), Some(id));
            prop_assert_eq!(uuid_to_kafka_string(id).len(), 22);
        }
    }
}
