//! Start-up check that the registered arenas can be locked, with a message that says how to fix
//! it. Registration pins memory and counts it against RLIMIT_MEMLOCK unless the process holds
//! CAP_IPC_LOCK; without this check the failure is a bare ENOMEM from `io_uring_register`.
//!
//! Reads /proc/self/limits and /proc/self/status rather than calling getrlimit/capget, which keeps
//! this module free of `unsafe`. Runs on the thread that starts the runtime.

use std::io;

/// Bit of CAP_IPC_LOCK in the capability masks (linux/capability.h).
const CAP_IPC_LOCK_BIT: u32 = 14;

/// Why the arenas cannot be locked.
#[derive(Debug, thiserror::Error)]
pub enum MemlockError {
    #[error(
        "the shard arenas need {needed} bytes of locked memory but RLIMIT_MEMLOCK allows only \
         {limit} bytes and the process lacks CAP_IPC_LOCK. Fix one of: set LimitMEMLOCK=infinity \
         (or at least {needed}) in the systemd unit; run `ulimit -l unlimited` (or a value in KiB \
         >= {needed_kib}) before starting kmirror; grant CAP_IPC_LOCK \
         (AmbientCapabilities=CAP_IPC_LOCK); or lower arena_bytes/shards in the config"
    )]
    TooLow {
        needed: u64,
        needed_kib: u64,
        limit: u64,
    },
    #[error("cannot read the memlock limit or capabilities from /proc/self: {0}")]
    Proc(#[from] io::Error),
}

/// The facts the decision depends on, read from /proc/self.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemlockFacts {
    /// Soft RLIMIT_MEMLOCK in bytes; `None` means unlimited.
    pub soft_limit: Option<u64>,
    pub has_cap_ipc_lock: bool,
}

impl MemlockFacts {
    pub fn read() -> Result<MemlockFacts, MemlockError> {
        let limits = std::fs::read_to_string("/proc/self/limits")?;
        let status = std::fs::read_to_string("/proc/self/status")?;
        Ok(MemlockFacts {
            soft_limit: parse_soft_memlock(&limits)?,
            has_cap_ipc_lock: parse_cap_eff(&status)? & (1u64 << CAP_IPC_LOCK_BIT) != 0,
        })
    }
}

/// Checks that `needed` bytes may be locked (all shards' arenas together: the kernel accounts
/// locked pages per user, so they add up).
pub fn check(needed: u64) -> Result<MemlockFacts, MemlockError> {
    let facts = MemlockFacts::read()?;
    decide(needed, facts)?;
    Ok(facts)
}

/// The pure decision, separate so it can be tested for every combination.
pub fn decide(needed: u64, facts: MemlockFacts) -> Result<(), MemlockError> {
    if facts.has_cap_ipc_lock {
        return Ok(());
    }
    match facts.soft_limit {
        None => Ok(()),
        Some(limit) if limit >= needed => Ok(()),
        Some(limit) => Err(MemlockError::TooLow {
            needed,
            needed_kib: needed.div_ceil(1024),
            limit,
        }),
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

fn parse_soft_memlock(limits: &str) -> io::Result<Option<u64>> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))
        .ok_or_else(|| bad("no 'Max locked memory' line in /proc/self/limits"))?;
    let soft = line["Max locked memory".len()..]
        .split_whitespace()
        .next()
        .ok_or_else(|| bad("empty 'Max locked memory' line"))?;
    if soft == "unlimited" {
        return Ok(None);
    }
    soft.parse::<u64>()
        .map(Some)
        .map_err(|_| bad("unparsable memlock soft limit"))
}

fn parse_cap_eff(status: &str) -> io::Result<u64> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .ok_or_else(|| bad("no CapEff line in /proc/self/status"))?;
    u64::from_str_radix(hex.trim(), 16).map_err(|_| bad("unparsable CapEff"))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the decision follows the kernel's rule (capability bypasses the limit; otherwise the
    // soft limit must cover the arenas) and the message names every fix.
    #[test]
    fn decision_and_message() {
        let cap = MemlockFacts {
            soft_limit: Some(0),
            has_cap_ipc_lock: true,
        };
        assert!(decide(1 << 30, cap).is_ok());
        let unlimited = MemlockFacts {
            soft_limit: None,
            has_cap_ipc_lock: false,
        };
        assert!(decide(1 << 30, unlimited).is_ok());
        let enough = MemlockFacts {
            soft_limit: Some(1 << 30),
            has_cap_ipc_lock: false,
        };
        assert!(decide(1 << 30, enough).is_ok());
        let low = MemlockFacts {
            soft_limit: Some(65536),
            has_cap_ipc_lock: false,
        };
        let msg = decide(1 << 20, low).unwrap_err().to_string();
        for fix in [
            "LimitMEMLOCK=",
            "ulimit -l",
            "CAP_IPC_LOCK",
            "1048576",
            "65536",
        ] {
            assert!(msg.contains(fix), "message lacks {fix}: {msg}");
        }
    }

    // Goal: the /proc parsers read the real files of this process.
    #[test]
    fn reads_proc_self() {
        let facts = MemlockFacts::read().unwrap();
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max locked memory"))
            .unwrap();
        match facts.soft_limit {
            None => assert!(line.contains("unlimited")),
            Some(n) => assert!(line.contains(&n.to_string())),
        }
    }
}
