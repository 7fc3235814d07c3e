//! The standard `process_*` metrics, read from /proc/self (what Prometheus client libraries
//! call the process collector; prometheus-client has none).

use std::time::{SystemTime, UNIX_EPOCH};

/// One reading of the process basics. Fields are `None` where /proc did not say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub start_time_seconds: Option<f64>,
    pub threads: Option<u64>,
}

fn clock_ticks() -> f64 {
    // Linux has reported USER_HZ = 100 to user space on every architecture since 2.6.
    100.0
}

fn page_size() -> u64 {
    4096
}

/// Reads /proc/self/{stat,fd,limits} and /proc/stat (boot time).
pub fn read() -> ProcessStats {
    let mut s = ProcessStats::default();
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // Fields after the parenthesised command name, which may itself contain spaces.
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
            let f: Vec<&str> = rest.split_whitespace().collect();
            // f[0] is field 3 (state); field n is f[n - 3].
            let num = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
            if let (Some(u), Some(k)) = (num(14), num(15)) {
                s.cpu_seconds = Some((u + k) as f64 / clock_ticks());
            }
            s.threads = num(20);
            s.virtual_bytes = num(23);
            s.resident_bytes = num(24).map(|p| p * page_size());
            if let (Some(start), Some(boot)) = (num(22), boot_time()) {
                s.start_time_seconds = Some(boot + start as f64 / clock_ticks());
            }
        }
    }
    s.open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as u64);
    s.max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|line| line.starts_with("Max open files"))
                .and_then(|line| line.split_whitespace().nth(3))
                .and_then(|v| v.parse().ok())
        });
    s
}

fn boot_time() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("btime "))?;
    line[6..].trim().parse().ok()
}

/// Seconds since the epoch, for comparisons in tests.
pub fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let s = read();
        assert!(s.threads.unwrap() >= 1);
        assert!(s.resident_bytes.unwrap() > 0);
        assert!(s.open_fds.unwrap() >= 3);
        assert!(s.max_fds.unwrap() >= s.open_fds.unwrap());
        let start = s.start_time_seconds.unwrap();
        // Started in the past, and not before this machine booted a day ago or so.
        assert!(start <= now_seconds() + 1.0, "{start}");
        assert!(start > 1.0e9, "{start}");
    }
}
