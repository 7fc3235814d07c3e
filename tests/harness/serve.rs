//! Running the `kmirror serve` binary in a test and waiting until its partition logs equal the
//! broker's byte for byte.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Upper bound on waiting for the mirror to catch up: a failure guard, not a performance claim.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(120);

pub fn log_bytes(dir: &Path) -> Vec<u8> {
    let mut logs: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect(),
        Err(_) => return Vec::new(),
    };
    logs.sort();
    logs.iter()
        .flat_map(|p| std::fs::read(p).unwrap())
        .collect()
}

pub struct Serve {
    pub child: Child,
    log: PathBuf,
}

impl Serve {
    pub fn start(config: &Path, log: PathBuf) -> Serve {
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .args(["serve", "--config"])
            .arg(config)
            .env("KMIRROR_LOG", "info")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap();
        Serve { child, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "kmirror serve exited early ({status}):\n{}",
                self.log_text()
            );
        }
    }

    pub fn sigterm_and_wait(mut self) -> String {
        let pid = self.child.id().to_string();
        let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(killed.success());
        let status = self.child.wait().unwrap();
        let text = self.log_text();
        assert!(
            status.success(),
            "kmirror serve failed on SIGTERM ({status}):\n{text}"
        );
        text
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn wait_mirrored(serve: &mut Serve, broker_dir: &Path, our_dir: &Path) {
    let start = Instant::now();
    loop {
        serve.assert_running();
        let theirs = log_bytes(broker_dir);
        let ours = log_bytes(our_dir);
        if !theirs.is_empty() && theirs == ours {
            return;
        }
        if start.elapsed() > CATCH_UP_LIMIT {
            panic!(
                "not mirrored: broker has {} log bytes, we have {}\n{}",
                theirs.len(),
                ours.len(),
                serve.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
