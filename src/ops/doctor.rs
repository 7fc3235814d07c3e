//! `kmirror doctor CONFIG`: checks the host against a serve configuration before (or while)
//! kmirror runs, one pass / warn / fail line per check, each failure with its fix. Exits
//! non-zero when anything failed.
//!
//! Checks: io_uring and each ring setup flag set; RLIMIT_MEMLOCK against the arenas; allowed
//! CPUs against shards (and `runtime.cores`); the data dir's filesystem (on ext4, whether it
//! keeps a journal) and free space; the sources answering ApiVersions: the static `[source]`,
//! or with `[admin]` every mirror the running admin API lists.

use std::io::Write;
use std::path::Path;

use crate::config::ServeConfig;
use crate::control::controller::SourceCheck;
use crate::fetch::blocking::BlockingClient;
use crate::limits::{DOCTOR_FREE_BYTES_FAIL, DOCTOR_FREE_BYTES_WARN};
use crate::ops::admin_client::AdminTarget;
use crate::runtime::memlock::{self, MemlockFacts};
use crate::runtime::ring::probe_setup;
use crate::runtime::RingMode;

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Pass,
    Warn,
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub level: Level,
    pub check: String,
    pub detail: String,
    /// What to do about a warning or failure.
    pub fix: Option<String>,
}

fn pass(check: &str, detail: String) -> Finding {
    Finding {
        level: Level::Pass,
        check: check.to_owned(),
        detail,
        fix: None,
    }
}

fn bad(level: Level, check: &str, detail: String, fix: String) -> Finding {
    Finding {
        level,
        check: check.to_owned(),
        detail,
        fix: Some(fix),
    }
}

/// Runs every check for `config`.
pub fn diagnose(config: &ServeConfig) -> Vec<Finding> {
    let mut out = io_uring_checks();
    out.push(memlock_check(config));
    out.push(cores_check(config));
    out.extend(data_dir_checks(&config.storage.data_dir));
    out.extend(source_checks(config));
    out
}

fn io_uring_checks() -> Vec<Finding> {
    let probes = probe_setup();
    let mut out = Vec::new();
    let works: Vec<RingMode> = probes
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(m, _)| *m)
        .collect();
    if works.is_empty() {
        let why = probes
            .iter()
            .map(|(m, r)| {
                format!(
                    "{m}: {}",
                    r.as_ref().err().map_or(String::new(), |e| e.to_string())
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        out.push(bad(
            Level::Fail,
            "io_uring",
            format!("io_uring_setup fails with every flag set ({why})"),
            "use Linux ≥ 5.19 with io_uring enabled (sysctl kernel.io_uring_disabled=0), and \
             allow io_uring_setup/io_uring_enter/io_uring_register in seccomp (the unit's \
             SystemCallFilter, a container's seccomp profile)"
                .to_owned(),
        ));
        return out;
    }
    let best = works[0];
    let detail = probes
        .iter()
        .map(|(m, r)| format!("{m}={}", if r.is_ok() { "ok" } else { "refused" }))
        .collect::<Vec<_>>()
        .join(", ");
    if best == RingMode::SingleIssuerDeferTaskrun {
        out.push(pass(
            "io_uring",
            format!("shards will use {best} ({detail})"),
        ));
    } else {
        out.push(bad(
            Level::Warn,
            "io_uring",
            format!("shards will fall back to {best} ({detail})"),
            "SINGLE_ISSUER|DEFER_TASKRUN needs Linux ≥ 6.1; upgrade the kernel for fewer \
             completion interrupts"
                .to_owned(),
        ));
    }
    out
}

fn memlock_check(config: &ServeConfig) -> Finding {
    let r = &config.runtime;
    let needed = (r.shards * r.arena_slots * r.arena_slot_bytes) as u64;
    let facts = match MemlockFacts::read() {
        Ok(f) => f,
        Err(e) => {
            return bad(
                Level::Fail,
                "memlock",
                e.to_string(),
                "run on Linux with /proc mounted".to_owned(),
            )
        }
    };
    let limit = facts
        .soft_limit
        .map_or("unlimited".to_owned(), |l| format!("{l} B"));
    match memlock::decide(needed, facts) {
        Ok(()) => pass(
            "memlock",
            format!(
                "arenas need {needed} B locked; RLIMIT_MEMLOCK {limit}{}",
                if facts.has_cap_ipc_lock {
                    ", CAP_IPC_LOCK held"
                } else {
                    ""
                }
            ),
        ),
        Err(e) => bad(
            Level::Fail,
            "memlock",
            e.to_string(),
            format!(
                "LimitMEMLOCK={} (or more) in the unit, `ulimit -l {}` in a shell, or lower \
                 runtime.shards × arena_slots × arena_slot_bytes",
                needed,
                needed.div_ceil(1024)
            ),
        ),
    }
}

fn cores_check(config: &ServeConfig) -> Finding {
    let allowed: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    let shards = config.runtime.shards;
    if let Some(cores) = &config.runtime.cores {
        let missing: Vec<&usize> = cores.iter().filter(|c| !allowed.contains(c)).collect();
        if !missing.is_empty() {
            return bad(
                Level::Fail,
                "cores",
                format!("runtime.cores {cores:?} includes {missing:?}, not in the allowed CPUs {allowed:?}"),
                "pick cores from the allowed set (see CPUAffinity= and `taskset -p $$`)".to_owned(),
            );
        }
    }
    if allowed.len() < shards {
        return bad(
            Level::Fail,
            "cores",
            format!(
                "{shards} shards need {shards} CPUs but {} are allowed ({allowed:?})",
                allowed.len()
            ),
            format!("set runtime.shards ≤ {} or allow more CPUs", allowed.len()),
        );
    }
    if allowed.len() == shards {
        return bad(
            Level::Warn,
            "cores",
            format!("{shards} shards take every allowed CPU ({allowed:?})"),
            "leave a core for the control thread, IRQs and the kernel (tuning/README.md)"
                .to_owned(),
        );
    }
    pass(
        "cores",
        format!(
            "{shards} shards on {} allowed CPUs {allowed:?}",
            allowed.len()
        ),
    )
}

/// Whether the ext4 filesystem holding `at` keeps a journal, from the kernel's
/// `<sys>/fs/ext4/<device>/journal_task` (the journal thread's pid, or `<none>`); the device is
/// found through `<sys>/dev/block/<major>:<minor>`. `None` when the kernel does not say.
fn ext4_has_journal(sys: &Path, at: &Path) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(at).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let link = std::fs::read_link(sys.join(format!("dev/block/{major}:{minor}"))).ok()?;
    let name = link.file_name()?;
    let task = std::fs::read_to_string(sys.join("fs/ext4").join(name).join("journal_task")).ok()?;
    Some(task.trim() != "<none>")
}

/// The filesystem line for an ext4 data dir. Without a journal, ext4 passes over inodes freed
/// in the last minutes when it creates files (it cannot tell whether their old contents were
/// overwritten yet), so a start right after many partitions were deleted spends 10-20 s
/// finding free inodes (benches/RESULTS.md, session 19), and a power loss leaves metadata
/// that only fsck repairs.
fn ext4_journal_finding(where_: String, journal: Option<bool>) -> Finding {
    match journal {
        Some(true) => pass("filesystem", format!("{where_} with a journal")),
        Some(false) => bad(
            Level::Warn,
            "filesystem",
            format!(
                "{where_} without a journal: starts after mass deletions are slow \
                 (recently freed inodes are skipped) and a power loss needs fsck"
            ),
            "put storage.data_dir on ext4 with a journal (mkfs.ext4's default) or XFS".to_owned(),
        ),
        None => pass(
            "filesystem",
            format!("{where_} (journal not reported by the kernel)"),
        ),
    }
}

/// Filesystem magic numbers (statfs f_type) of the filesystems worth naming.
fn fs_name(magic: u64) -> &'static str {
    match magic {
        0x5846_5342 => "xfs",
        0xEF53 => "ext4",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlayfs",
        0x6969 => "nfs",
        0x2FC1_2FC1 => "zfs",
        _ => "other",
    }
}

fn data_dir_checks(dir: &Path) -> Vec<Finding> {
    // A data dir that does not exist yet is created by serve; check where it will be.
    let mut at = dir;
    while !at.exists() {
        match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => at = p,
            _ => break,
        }
    }
    let mut out = Vec::new();
    let stat = match rustix::fs::statfs(at) {
        Ok(s) => s,
        Err(e) => {
            out.push(bad(
                Level::Fail,
                "data dir",
                format!("cannot statfs {}: {e}", at.display()),
                "create storage.data_dir (or its parent) and make it readable".to_owned(),
            ));
            return out;
        }
    };
    let fs = fs_name(stat.f_type as u64);
    let where_ = format!("{} ({fs})", dir.display());
    match fs {
        "ext4" => out.push(ext4_journal_finding(
            where_,
            ext4_has_journal(Path::new("/sys"), at),
        )),
        "xfs" => out.push(pass("filesystem", where_)),
        "tmpfs" | "overlayfs" | "nfs" => out.push(bad(
            Level::Warn,
            "filesystem",
            format!("{where_}: not a durable local disk filesystem"),
            "put storage.data_dir on XFS or ext4 on a local disk (tuning/README.md)".to_owned(),
        )),
        _ => out.push(bad(
            Level::Warn,
            "filesystem",
            format!("{where_}: untested filesystem (magic {:#x})", stat.f_type),
            "XFS or ext4 are the filesystems Kafka and kmirror are run on".to_owned(),
        )),
    }
    match rustix::fs::statvfs(at) {
        Ok(v) => {
            let free = v.f_bavail * v.f_frsize;
            let gib = free as f64 / (1u64 << 30) as f64;
            let detail = format!("{gib:.1} GiB free under {}", at.display());
            if free < DOCTOR_FREE_BYTES_FAIL {
                out.push(bad(
                    Level::Fail,
                    "free space",
                    detail,
                    "free space or move storage.data_dir: a full disk stops every partition"
                        .to_owned(),
                ));
            } else if free < DOCTOR_FREE_BYTES_WARN {
                out.push(bad(
                    Level::Warn,
                    "free space",
                    detail,
                    "size the disk for the mirrored topics' retention (tuning/README.md)"
                        .to_owned(),
                ));
            } else {
                out.push(pass("free space", detail));
            }
        }
        Err(e) => out.push(bad(
            Level::Fail,
            "free space",
            format!("cannot statvfs {}: {e}", at.display()),
            "check the data dir's mount".to_owned(),
        )),
    }
    out
}

/// ApiVersions to each bootstrap server of one source.
fn check_source(name: &str, servers: &[String], client_id: &str) -> Vec<Finding> {
    servers
        .iter()
        .map(|addr| {
            let check = format!("source {name} {addr}");
            match BlockingClient::connect(addr, client_id) {
                Ok(c) => pass(
                    &check,
                    format!("answers ApiVersions (Fetch v{})", c.versions.fetch),
                ),
                Err(e) => bad(
                    Level::Fail,
                    &check,
                    e.to_string(),
                    "check the address, DNS, firewalls and that the broker listens there \
                     (`nc -vz host port`)"
                        .to_owned(),
                ),
            }
        })
        .collect()
}

fn source_checks(config: &ServeConfig) -> Vec<Finding> {
    if let Some((source, _)) = config.static_mirror() {
        return check_source("[source]", &source.bootstrap_servers, &source.client_id);
    }
    let Some(admin) = &config.admin else {
        return Vec::new();
    };
    // Mirror definitions live in the running server's __mirror_state; ask its admin API.
    let target = match AdminTarget::of_section(admin) {
        Ok(t) => t,
        Err(e) => {
            return vec![bad(
                Level::Fail,
                "admin",
                format!("cannot reach the admin API as configured: {e}"),
                "fix [admin] token_file / tls_cert_file".to_owned(),
            )]
        }
    };
    let listed = target
        .get("/mirrors")
        .call()
        .map_err(|e| e.to_string())
        .and_then(|mut r| {
            if !r.status().is_success() {
                return Err(format!("HTTP {}", r.status()));
            }
            r.body_mut()
                .read_json::<Vec<crate::control::controller::MirrorSummary>>()
                .map_err(|e| e.to_string())
        });
    match listed {
        Ok(mirrors) if mirrors.is_empty() => vec![pass("mirrors", "none defined".to_owned())],
        Ok(mirrors) => mirrors
            .iter()
            .map(|m| mirror_source_check(&target, &m.mirror))
            .collect(),
        Err(e) => vec![bad(
            Level::Warn,
            "mirrors",
            format!(
                "admin API {} not answering ({e}); mirror sources not checked",
                admin.listen
            ),
            "start kmirror (systemctl start kmirror) and run doctor again to check the sources"
                .to_owned(),
        )],
    }
}

/// One mirror's source, reached and authenticated by the running kmirror with the mirror's own
/// settings: doctor never sees the credentials.
fn mirror_source_check(admin: &AdminTarget, mirror: &str) -> Finding {
    let check = format!("source of mirror {mirror}");
    let answer = admin
        .get(&format!("/mirrors/{mirror}/source"))
        .call()
        .map_err(|e| e.to_string())
        .and_then(|mut r| {
            if !r.status().is_success() {
                return Err(format!("HTTP {}", r.status()));
            }
            r.body_mut()
                .read_json::<SourceCheck>()
                .map_err(|e| e.to_string())
        });
    let c = match answer {
        Ok(c) => c,
        Err(e) => {
            return bad(
                Level::Warn,
                &check,
                format!("the admin API did not check it: {e}"),
                "run doctor again while kmirror is running".to_owned(),
            )
        }
    };
    let how = match (&c.sasl_mechanism, &c.sasl_username) {
        (Some(mech), Some(user)) => format!("{} as {user} ({mech})", c.security_protocol),
        _ => c.security_protocol.clone(),
    };
    match &c.error {
        None => pass(
            &check,
            format!(
                "{} answers over {how}: cluster {}, {} topics",
                c.bootstrap_servers,
                c.cluster_id
                    .as_deref()
                    .unwrap_or("(no id: ZooKeeper-era source)"),
                c.topics.unwrap_or(0)
            ),
        ),
        Some(e) if !c.retryable => bad(
            Level::Fail,
            &check,
            format!("{} refused {how}: {e}", c.bootstrap_servers),
            "fix the mirror's credentials or certificates (sasl.jaas.config, ssl.truststore.*, \
             ssl.keystore.*): delete and create the mirror with the right properties"
                .to_owned(),
        ),
        Some(e) => bad(
            Level::Fail,
            &check,
            format!("{} not reachable over {how}: {e}", c.bootstrap_servers),
            "check the address, DNS, firewalls and that the broker listens there \
             (`nc -vz host port`)"
                .to_owned(),
        ),
    }
}

/// Prints the report; returns whether nothing failed.
pub fn print(findings: &[Finding], out: &mut impl Write) -> std::io::Result<bool> {
    for f in findings {
        let tag = match f.level {
            Level::Pass => "PASS",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        writeln!(out, "{tag} {}: {}", f.check, f.detail)?;
        if let Some(fix) = &f.fix {
            writeln!(out, "     fix: {fix}")?;
        }
    }
    let failed = findings.iter().filter(|f| f.level == Level::Fail).count();
    let warned = findings.iter().filter(|f| f.level == Level::Warn).count();
    writeln!(
        out,
        "{failed} failed, {warned} warnings, {} checks",
        findings.len()
    )?;
    Ok(failed == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filesystem_names() {
        assert_eq!(fs_name(0x5846_5342), "xfs");
        assert_eq!(fs_name(0xEF53), "ext4");
        assert_eq!(fs_name(1), "other");
    }

    // Goal: the data dir's ext4 journal is read from the kernel's own sysfs entries. Method: a
    // copy of the two sysfs entries the check reads, for this file's device, once with a
    // journal thread and once with `<none>`; and the real /sys on this host, which must answer
    // whenever the test's own directory is on ext4.
    #[test]
    fn ext4_journal_is_read_from_sysfs() {
        use std::os::unix::fs::MetadataExt;
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dev = std::fs::metadata(here).unwrap().dev();
        let sys = tempfile::tempdir().unwrap();
        let block = sys.path().join("dev/block");
        std::fs::create_dir_all(&block).unwrap();
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        std::os::unix::fs::symlink(
            "../../devices/virtual/block/testdisk",
            block.join(format!("{major}:{minor}")),
        )
        .unwrap();
        assert_eq!(
            ext4_has_journal(sys.path(), here),
            None,
            "no ext4 entry yet"
        );
        let fs = sys.path().join("fs/ext4/testdisk");
        std::fs::create_dir_all(&fs).unwrap();
        std::fs::write(fs.join("journal_task"), "<none>\n").unwrap();
        assert_eq!(ext4_has_journal(sys.path(), here), Some(false));
        let finding = ext4_journal_finding("d (ext4)".into(), Some(false));
        assert_eq!(finding.level, Level::Warn);
        assert!(finding.fix.unwrap().contains("journal"));
        std::fs::write(fs.join("journal_task"), "812\n").unwrap();
        assert_eq!(ext4_has_journal(sys.path(), here), Some(true));
        assert_eq!(
            ext4_journal_finding("d (ext4)".into(), Some(true)).level,
            Level::Pass
        );

        let on_ext4 = fs_name(rustix::fs::statfs(here).unwrap().f_type as u64) == "ext4";
        if on_ext4 && Path::new("/sys/fs/ext4").exists() {
            assert!(
                ext4_has_journal(Path::new("/sys"), here).is_some(),
                "this host's ext4 did not say whether it has a journal"
            );
        }
    }

    #[test]
    fn report_counts_failures() {
        let f = vec![
            pass("a", "ok".into()),
            bad(Level::Fail, "b", "broken".into(), "mend it".into()),
        ];
        let mut out = Vec::new();
        assert!(!print(&f, &mut out).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("FAIL b: broken\n     fix: mend it"));
        assert!(text.contains("1 failed, 0 warnings, 2 checks"));
    }
}
