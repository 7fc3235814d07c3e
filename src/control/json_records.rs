//! Small durable records beside `__mirror_state`: one JSON file per name in a directory of the
//! data dir, each written atomically (temp file, fsync, rename, directory fsync). Used for the
//! state a restart must find of operations that outlive one admin request: drills in progress
//! (`kmirror-drills/`) and consistent cuts under way (`kmirror-cuts/`).
//!
//! Names are file-name safe by construction (mirror names and drill names allow only
//! `A-Za-z0-9._-` and are never `.` or `..`); a record larger than `JSON_RECORD_BYTES_MAX` is
//! refused when read.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::limits::JSON_RECORD_BYTES_MAX;
use crate::log::checkpoint::{sync_dir, write_atomically};

/// One directory of records.
#[derive(Debug, Clone)]
pub struct JsonRecords {
    dir: PathBuf,
}

impl JsonRecords {
    /// The records in `<data_dir>/<dir_name>` (created on the first `put`).
    pub fn new(data_dir: &Path, dir_name: &str) -> JsonRecords {
        JsonRecords {
            dir: data_dir.join(dir_name),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        assert!(
            !name.is_empty() && name != "." && name != ".." && !name.contains('/'),
            "record names are file-name safe: {name:?}"
        );
        self.dir.join(format!("{name}.json"))
    }

    /// Writes (or replaces) `name` durably.
    pub fn put<T: Serialize>(&self, name: &str, value: &T) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let json = serde_json::to_vec_pretty(value).map_err(|e| e.to_string())?;
        write_atomically(&self.path(name), &json).map_err(|e| e.to_string())?;
        sync_dir(&self.dir).map_err(|e| e.to_string())
    }

    /// Deletes `name` durably (absent: nothing to do).
    pub fn remove(&self, name: &str) -> Result<(), String> {
        let path = self.path(name);
        match std::fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir).map_err(|e| e.to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// Every record, by name; one that cannot be read or parsed comes back as its error
    /// (the caller reports it and leaves the file for the operator).
    pub fn load_all<T: DeserializeOwned>(&self) -> Vec<(String, Result<T, String>)> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<(String, Result<T, String>)> = rd
            .filter_map(Result::ok)
            .filter_map(|e| {
                let file = e.file_name().to_string_lossy().into_owned();
                let name = file.strip_suffix(".json")?.to_owned();
                Some((name, read(&e.path())))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

impl JsonRecords {
    /// `load_all` without the records that cannot be read: each is logged (as `what`) and
    /// its file left for the operator.
    pub fn load_readable<T: DeserializeOwned>(&self, what: &str) -> Vec<(String, T)> {
        self.load_all()
            .into_iter()
            .filter_map(|(name, r)| match r {
                Ok(v) => Some((name, v)),
                Err(e) => {
                    tracing::error!(%name, "{what} record unreadable, left as it is: {e}");
                    None
                }
            })
            .collect()
    }
}

fn read<T: DeserializeOwned>(path: &Path) -> Result<T, String> {
    let err = |e: String| format!("{}: {e}", path.display());
    let len = std::fs::metadata(path)
        .map_err(|e| err(e.to_string()))?
        .len();
    if len > JSON_RECORD_BYTES_MAX {
        return Err(err(format!("larger than {JSON_RECORD_BYTES_MAX} bytes")));
    }
    let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_load_remove_round_trip_and_bad_files_come_back_as_errors() {
        let dir = tempfile::tempdir().unwrap();
        let r = JsonRecords::new(dir.path(), "recs");
        assert!(r.load_all::<Vec<i32>>().is_empty());
        r.put("b", &vec![2]).unwrap();
        r.put("a", &vec![1]).unwrap();
        r.put("a", &vec![1, 1]).unwrap();
        std::fs::write(dir.path().join("recs/bad.json"), b"{").unwrap();
        std::fs::write(dir.path().join("recs/a.json.tmp"), b"[9]").unwrap();
        let all = r.load_all::<Vec<i32>>();
        let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "bad"]);
        assert_eq!(all[0].1, Ok(vec![1, 1]));
        assert!(all[2].1.is_err());
        r.remove("a").unwrap();
        r.remove("a").unwrap();
        assert_eq!(r.load_all::<Vec<i32>>().len(), 2);
    }
}
