//! How far the synthetic source has served its finite topic, announced on stdout, so a benchmark
//! can time a mirror from outside without walking the mirror's data dir while it runs (at 16,384
//! partitions one `find` over the log dir costs ≈ 0.35 CPU-s, which on a 2-core box would take
//! a core from the mirror it is measuring).
//!
//! Two moments, each announced once: the first Fetch response that carried record bytes, and the
//! response after which every partition had been served up to its log end. Times are wall-clock
//! seconds, comparable with file modification times on the same machine.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Per-partition "served to its end" flags and the two announced moments.
#[derive(Debug)]
pub struct ServeProgress {
    /// One flag per partition (topic index × partitions + partition).
    done: Vec<AtomicBool>,
    remaining: AtomicUsize,
    first_records: OnceLock<f64>,
    all_served: OnceLock<f64>,
    /// Whether the moments are printed (the binary asks; in-process tests do not).
    announce: AtomicBool,
}

impl ServeProgress {
    pub fn new(partitions: usize) -> ServeProgress {
        ServeProgress {
            done: (0..partitions).map(|_| AtomicBool::new(false)).collect(),
            remaining: AtomicUsize::new(partitions),
            first_records: OnceLock::new(),
            all_served: OnceLock::new(),
            announce: AtomicBool::new(false),
        }
    }

    /// Print `first_records_at=<s>` and `all_served_at=<s>` on stdout when they happen.
    pub fn announce(&self) {
        self.announce.store(true, Ordering::Relaxed);
    }

    /// A response was sent that carried records for partition `global` (when `batches > 0`) and
    /// left its next fetch at `next`; `end` is the finite log end, `None` for an endless topic.
    pub fn served(&self, global: usize, batches: usize, next: i64, end: Option<i64>) {
        if batches > 0 && self.first_records.get().is_none() {
            self.mark(&self.first_records, "first_records_at");
        }
        let Some(end) = end else {
            return;
        };
        let Some(flag) = self.done.get(global) else {
            return;
        };
        // A load first: every request reports every partition of its session, and most are
        // long done; a swap each time would write the shared line per partition per request.
        if next >= end
            && !flag.load(Ordering::Relaxed)
            && !flag.swap(true, Ordering::Relaxed)
            && self.remaining.fetch_sub(1, Ordering::AcqRel) == 1
        {
            self.mark(&self.all_served, "all_served_at");
        }
    }

    /// Wall-clock seconds of the first response with records, once there was one.
    pub fn first_records_at(&self) -> Option<f64> {
        self.first_records.get().copied()
    }

    /// Wall-clock seconds at which every partition had been served to its end.
    pub fn all_served_at(&self) -> Option<f64> {
        self.all_served.get().copied()
    }

    fn mark(&self, cell: &OnceLock<f64>, what: &str) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        if cell.set(now).is_ok() && self.announce.load(Ordering::Relaxed) {
            let mut out = std::io::stdout().lock();
            // A benchmark polls the file this goes to: it must not sit in a buffer.
            let _ = writeln!(out, "{what}={now:.6}");
            let _ = out.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_served_only_after_every_partition_reached_its_end_once() {
        let p = ServeProgress::new(2);
        p.served(0, 0, 0, Some(10));
        assert_eq!(p.first_records_at(), None);
        p.served(0, 1, 10, Some(10));
        assert!(p.first_records_at().is_some());
        // Serving partition 0's end again must not count it twice.
        p.served(0, 0, 10, Some(10));
        assert_eq!(p.all_served_at(), None);
        p.served(1, 2, 5, Some(10));
        assert_eq!(p.all_served_at(), None);
        p.served(1, 1, 10, Some(10));
        assert!(p.all_served_at().is_some());
    }

    #[test]
    fn an_endless_topic_is_never_all_served() {
        let p = ServeProgress::new(1);
        p.served(0, 3, 1 << 40, None);
        assert!(p.first_records_at().is_some());
        assert_eq!(p.all_served_at(), None);
    }
}
