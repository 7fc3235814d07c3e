//! A unix datagram socket standing in for systemd's `NOTIFY_SOCKET`: every message kmirror
//! sends (READY=1, WATCHDOG=1, STATUS=…, EXTEND_TIMEOUT_USEC=…) is collected in arrival order
//! by a background thread.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct NotifySocket {
    pub path: PathBuf,
    seen: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NotifySocket {
    /// Binds `dir/notify.sock` and starts collecting.
    pub fn bind(dir: &Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (Arc::clone(&seen), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while !st.load(Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                    s.lock().unwrap().push(msg);
                }
            }
        });
        NotifySocket {
            path,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// Every message so far, in arrival order.
    pub fn messages(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    /// How many messages so far carry the line `line` (e.g. "WATCHDOG=1").
    pub fn count(&self, line: &str) -> usize {
        self.messages()
            .iter()
            .filter(|m| m.lines().any(|l| l == line))
            .count()
    }

    /// Waits up to `limit` until `want` holds for the messages so far.
    pub fn wait_for(&self, limit: Duration, want: impl Fn(&[String]) -> bool) -> Vec<String> {
        let start = Instant::now();
        loop {
            let m = self.messages();
            if want(&m) {
                return m;
            }
            assert!(start.elapsed() < limit, "notifications so far: {m:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
