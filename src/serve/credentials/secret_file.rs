//! Files that hold secrets: written atomically (tmp, fsync, rename, fsync of the directory) and
//! 0600 whatever the process umask; read only when no one but the owner can read them.

use std::fs::{self, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::limits::CREDENTIAL_FILE_BYTES_MAX;
use crate::log::checkpoint::{sync_dir, tmp_path};

/// Owner read/write only.
pub const SECRET_MODE: u32 = 0o600;

#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{path} is readable or writable by group or others (mode {mode:04o}); it holds secrets: \
         chmod 600 it"
    )]
    TooOpen { path: String, mode: u32 },
    #[error("{path} is {len} bytes, more than the {max} a credential file may have")]
    TooLarge { path: String, len: u64, max: u64 },
}

fn io(path: &Path, source: std::io::Error) -> SecretFileError {
    SecretFileError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Replaces `path` with `contents`, mode 0600: a crash leaves the old file or the new one.
pub fn write_secret_file(path: &Path, contents: &[u8]) -> Result<(), SecretFileError> {
    let tmp = tmp_path(path);
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(SECRET_MODE)
            .open(&tmp)
            .map_err(|e| io(&tmp, e))?;
        // `mode` is filtered by the umask and ignored for an existing tmp file: set it
        // explicitly before a secret byte is written.
        f.set_permissions(Permissions::from_mode(SECRET_MODE))
            .map_err(|e| io(&tmp, e))?;
        f.write_all(contents).map_err(|e| io(&tmp, e))?;
        f.sync_all().map_err(|e| io(&tmp, e))?;
    }
    fs::rename(&tmp, path).map_err(|e| io(path, e))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    sync_dir(dir).map_err(|e| io(dir, std::io::Error::other(e.to_string())))
}

/// Reads a secret file, `None` if it does not exist; refuses one that group or others may
/// read or write.
pub fn read_secret_file(path: &Path) -> Result<Option<Vec<u8>>, SecretFileError> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path, e)),
    };
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(SecretFileError::TooOpen {
            path: path.display().to_string(),
            mode,
        });
    }
    if meta.len() > CREDENTIAL_FILE_BYTES_MAX {
        return Err(SecretFileError::TooLarge {
            path: path.display().to_string(),
            len: meta.len(),
            max: CREDENTIAL_FILE_BYTES_MAX,
        });
    }
    fs::read(path).map(Some).map_err(|e| io(path, e))
}

/// Makes an existing directory 0700 and every regular file directly in it 0600, so secrets
/// already written there (and files created inside later, whatever the umask) are out of
/// reach of other users.
pub fn restrict_dir(dir: &Path) -> Result<(), SecretFileError> {
    fs::set_permissions(dir, Permissions::from_mode(0o700)).map_err(|e| io(dir, e))?;
    for entry in fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let entry = entry.map_err(|e| io(dir, e))?;
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).map_err(|e| io(&path, e))?;
        if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
            fs::set_permissions(&path, Permissions::from_mode(SECRET_MODE))
                .map_err(|e| io(&path, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    // Goal: a secret file is 0600 even when the umask would let everyone read it, and one
    // that others can read is refused with a message that says what to do.
    #[test]
    fn secret_files_are_0600_whatever_the_umask_and_open_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.json");
        // (The umask 000 case is tests/serve_sasl.rs: kmirror run under `umask 000`.)
        write_secret_file(&p, b"one").unwrap();
        // An existing, open tmp file left by a crash is narrowed too.
        fs::write(tmp_path(&p), b"x").unwrap();
        fs::set_permissions(tmp_path(&p), Permissions::from_mode(0o666)).unwrap();
        write_secret_file(&p, b"two").unwrap();
        assert_eq!(mode(&p), 0o600);
        assert_eq!(read_secret_file(&p).unwrap().unwrap(), b"two");
        assert!(read_secret_file(&dir.path().join("none"))
            .unwrap()
            .is_none());
        fs::set_permissions(&p, Permissions::from_mode(0o640)).unwrap();
        let err = read_secret_file(&p).unwrap_err().to_string();
        assert!(
            err.contains("mode 0640") && err.contains("chmod 600"),
            "{err}"
        );
        restrict_dir(dir.path()).unwrap();
        assert_eq!(mode(&p), 0o600);
        assert_eq!(mode(dir.path()), 0o700);
    }
}
