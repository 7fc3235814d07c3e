//! kmirror's own cluster id, told to clients in Metadata.
//!
//! Every kmirror is its own one-broker cluster, so each needs its own id: a downstream mirror
//! (another kmirror fetching from this one) stores its source's cluster id, fails the mirror
//! when it changes, and records it in each topic's lineage (`control::lineage`). A shared
//! constant would make two kmirrors indistinguishable there. The id is created at the first
//! start (22 characters of URL-safe base64 over a random UUID, the shape of Kafka's ids) and
//! kept in `<data_dir>/kmirror-cluster-id`, so it survives restarts and moves with the data.

use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;

/// The file under the data dir that holds the id.
pub const CLUSTER_ID_FILE: &str = "kmirror-cluster-id";

fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(CLUSTER_ID_FILE)
}

/// A cluster id as Kafka spells them: base64url without padding of 16 bytes.
fn valid(id: &str) -> bool {
    id.len() == 22
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The id stored under `data_dir`, created (and fsynced, with its directory) when absent. A
/// file that does not hold a valid id is an error naming it: replacing it would silently give
/// this kmirror a new identity for its downstream mirrors.
pub fn load_or_create(data_dir: &Path) -> std::io::Result<String> {
    let file = path(data_dir);
    match std::fs::read_to_string(&file) {
        Ok(text) => {
            let id = text.trim();
            if valid(id) {
                return Ok(id.to_owned());
            }
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} does not hold a cluster id (22 characters of base64url): {id:?}",
                    file.display()
                ),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::create_dir_all(data_dir)?;
    let id =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(uuid::Uuid::new_v4().as_bytes());
    let tmp = data_dir.join(format!("{CLUSTER_ID_FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(format!("{id}\n").as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &file)?;
    std::fs::File::open(data_dir)?.sync_all()?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_made_once_and_kept_and_a_damaged_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        assert!(valid(&first), "{first}");
        assert_eq!(load_or_create(dir.path()).unwrap(), first);
        let other = tempfile::tempdir().unwrap();
        assert_ne!(load_or_create(other.path()).unwrap(), first);
        std::fs::write(path(dir.path()), "not an id\n").unwrap();
        let err = load_or_create(dir.path()).unwrap_err().to_string();
        assert!(err.contains(CLUSTER_ID_FILE), "{err}");
    }
}
