//! `kmirror mirrors ...`: the operator's client of the admin API, shaped like KIP-1279's
//! `kafka-cluster-mirrors.sh` (kip1279.md §5): one action per call, readable tables by
//! default, `--json` for scripts, and every error printed with what went wrong. The KIP tool's
//! spellings work too (README "Manage mirrors" has the comparison): its action flags
//! (`--describe` for `describe`, see [`accept_action_flags`]), `--bootstrap-server` for
//! `--admin`, `--mirror-name` for `--mirror`, and its column order and JSON keys.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::control::admin::{
    CreateBody, DrillBody, ErrorBody, RepointBody, StopAnswer, TopicsBody,
};
use crate::control::controller::{CommandReport, MirrorSummary, PartitionRow, RepointReport};
use crate::control::drill::DrillSummary;
use crate::control::loss_report::LossReport;
use crate::control::mirror_def::{parse_properties, StartFrom};
use crate::limits::{
    MIRROR_PROPERTIES_BYTES_MAX, MIRROR_RETRY_MAX_ATTEMPTS_DEFAULT, PROMOTE_POLL,
    PROMOTE_PROGRESS_EVERY, PROMOTE_TIMEOUT_MS_DEFAULT,
};
use crate::ops::admin_client::AdminTarget;

/// Where `kmirror serve` listens for admin requests unless configured otherwise.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9190";

#[derive(Debug, Args)]
pub struct MirrorsArgs {
    #[command(subcommand)]
    pub action: Action,
    /// The admin API of the kmirror to talk to (host:port of `[admin] listen`, not the Kafka
    /// listener). `--bootstrap-server` is the KIP tool's name for the cluster it manages.
    #[arg(long, global = true, default_value = DEFAULT_ADMIN, visible_alias = "bootstrap-server")]
    pub admin: String,
    /// A file (mode 0600) with the admin API's bearer token (`[admin] token_file`); also
    /// `KMIRROR_ADMIN_TOKEN_FILE`.
    #[arg(long, global = true, env = "KMIRROR_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// PEM CA certificate to verify an `https://` admin API with (its own certificate when
    /// self-signed); the Mozilla roots otherwise.
    #[arg(long, global = true, env = "KMIRROR_ADMIN_CA_FILE")]
    pub admin_ca_file: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum Action {
    /// Create a mirror from a Kafka-style properties file (bootstrap.servers, security.protocol...).
    Create {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: String,
        #[arg(long)]
        mirror_config: PathBuf,
        /// earliest, latest or a timestamp in ms (overrides mirror.start.from).
        #[arg(long)]
        start_from: Option<String>,
    },
    /// Point a mirror at another source holding the same history (a re-point): every partition
    /// not STOPPED resumes from its local log end once the new source is shown to hold its last
    /// batch byte for byte with agreeing leader epochs; otherwise nothing changes.
    Repoint {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: String,
        /// The new source's connection properties (as for `create`; the topics stay).
        #[arg(long)]
        mirror_config: PathBuf,
    },
    /// Start mirroring the source topics matching comma-separated regexes.
    Start {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: String,
        #[arg(long)]
        topics: String,
        #[arg(long)]
        exclude: Option<String>,
    },
    /// Pause mirrored topics (fetchers removed; resume continues from the local log end).
    Pause {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: String,
        #[arg(long)]
        topics: String,
    },
    /// Resume paused topics.
    Resume {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: String,
        #[arg(long)]
        topics: String,
    },
    /// Stop mirroring topics (records the last mirror epoch and end offset). This is the
    /// failover: the topics become writable on kmirror.
    Stop {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: String,
        #[arg(long)]
        topics: String,
        /// Planned failover: wait until kmirror holds everything the source has (lag 0 by a
        /// fresh ListOffsets), then stop. Stop the source's producers first.
        #[arg(long)]
        promote: bool,
        /// How long --promote waits for zero lag before giving up (nothing is stopped then).
        #[arg(long, default_value_t = PROMOTE_TIMEOUT_MS_DEFAULT, requires = "promote")]
        promote_timeout_ms: u64,
        /// Refuse the failover (nothing is stopped) when it may lose more than this many
        /// seconds of records by the loss report (an unknown span counts as more).
        #[arg(long, conflicts_with = "promote")]
        max_loss_seconds: Option<f64>,
        /// With --max-loss-seconds: fail over anyway (the report records that it was forced).
        #[arg(long, requires = "max_loss_seconds")]
        force: bool,
        /// Consistent cut: truncate every partition stopped to this source timestamp (ms);
        /// what is cut goes to the quarantine under the data dir and is reported.
        #[arg(long, conflicts_with = "promote")]
        cut_at_timestamp: Option<i64>,
    },
    /// Failover drills: writable clones of mirrored topics (`drill.<name>.<topic>` on the Kafka
    /// listener) while mirroring continues.
    Drill {
        #[command(subcommand)]
        action: DrillAction,
    },
    /// Failback to the original cluster after a failover: report its divergent tail, copy
    /// what was written on kmirror back with an exact offset map, move the groups.
    Failback {
        #[command(subcommand)]
        action: crate::ops::failback_cli::FailbackAction,
    },
    /// The loss reports of a mirror's stops (what each failover may have lost), oldest first.
    LossReport {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: String,
        /// Only the newest report.
        #[arg(long)]
        last: bool,
    },
    /// Delete a mirror whose topics are all STOPPED.
    Delete {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: String,
    },
    /// List mirrors.
    List,
    /// Per-partition state, offsets, lag and last error.
    Describe {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: Option<String>,
        /// Only FAILED partitions, with retry count and error.
        #[arg(long)]
        failed: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum DrillAction {
    /// Clone the mirror's partitions of the matching topics as drill.<name>.<topic>.
    Start {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: String,
        #[arg(long)]
        topics: String,
        /// The drill's name (A-Z a-z 0-9 _ -), part of its topics' names.
        #[arg(long)]
        name: String,
    },
    /// Delete a drill's clones.
    Stop {
        #[arg(long)]
        name: String,
    },
    /// The drills in progress and their disk use.
    List,
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot read {path}: {source}")]
    ReadConfig {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    BadConfig { path: PathBuf, reason: String },
    #[error("{0}")]
    BadArgument(String),
    #[error(
        "cannot reach the kmirror admin API at {addr}: {reason} (--admin/--bootstrap-server is \
         the address of kmirror's `[admin] listen`, not of a Kafka listener)"
    )]
    Unreachable { addr: String, reason: String },
    /// The server refused the request; its message names the problem.
    #[error("{0}")]
    Refused(String),
    /// The server cannot do it yet (HTTP 503: `--promote` and the mirror still lags).
    #[error("{0}")]
    NotYet(String),
    #[error("gave up after {waited_ms} ms: {last}")]
    PromoteTimeout { waited_ms: u64, last: String },
    #[error("unexpected answer from {addr}: {reason}")]
    BadAnswer { addr: String, reason: String },
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

/// Accepts the KIP tool's action flags: `kmirror mirrors --describe --mirror m` is turned into
/// `kmirror mirrors describe --mirror m` before clap parses `argv` (kmirror's actions are
/// subcommands, like its other commands; the KIP's `kafka-cluster-mirrors.sh --create/--start/
/// ...` are flags, like Kafka's other tools). `argv` without `mirrors` first, or already naming
/// the subcommand, is returned as it is; two action flags are refused, as the KIP tool refuses
/// them. Option values are never taken for actions (`--topics --list` keeps `--list` a value).
pub fn accept_action_flags(argv: Vec<OsString>) -> Result<Vec<OsString>, CliError> {
    if argv.get(1).and_then(|a| a.to_str()) != Some("mirrors") {
        return Ok(argv);
    }
    let cmd = MirrorsArgs::augment_args(clap::Command::new("mirrors"));
    let actions: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .collect();
    // Every `--long` spelling (and alias) that takes a value, in any action.
    let mut takes_value: Vec<String> = Vec::new();
    for arg in cmd
        .get_arguments()
        .chain(cmd.get_subcommands().flat_map(|c| c.get_arguments()))
    {
        if arg.get_action().takes_values() {
            takes_value.extend(arg.get_long().map(str::to_owned));
            takes_value.extend(
                arg.get_all_aliases()
                    .unwrap_or_default()
                    .into_iter()
                    .map(str::to_owned),
            );
        }
    }
    let mut flags = Vec::new(); // (index in argv, action)
    let mut i = 2;
    while i < argv.len() {
        let Some(token) = argv[i].to_str() else {
            i += 1;
            continue;
        };
        if actions.iter().any(|a| a == token) {
            return Ok(argv); // the subcommand form
        }
        if let Some(long) = token.strip_prefix("--") {
            if let Some(action) = actions.iter().find(|a| *a == long) {
                flags.push((i, action.clone()));
            } else if takes_value.iter().any(|t| t == long) {
                i += 1; // skip its value
            }
        }
        i += 1;
    }
    match flags.as_slice() {
        [] => Ok(argv),
        [(at, action)] => {
            let mut out = argv;
            out.remove(*at);
            out.insert(2, OsString::from(action));
            Ok(out)
        }
        [(_, a), (_, b), ..] => Err(CliError::BadArgument(format!(
            "one action per call, got --{a} and --{b}"
        ))),
    }
}

pub(crate) struct Client {
    target: AdminTarget,
    addr: String,
}

impl Client {
    fn new(args: &MirrorsArgs) -> Result<Client, CliError> {
        Client::connect(
            &args.admin,
            args.admin_token_file.as_deref(),
            args.admin_ca_file.as_deref(),
        )
    }

    /// A client of the admin API at `admin` (also for `kmirror audit`).
    pub(crate) fn connect(
        admin: &str,
        token_file: Option<&std::path::Path>,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Client, CliError> {
        let target = AdminTarget::new(admin, token_file, ca_file).map_err(CliError::BadArgument)?;
        Ok(Client {
            target,
            addr: admin.to_owned(),
        })
    }

    fn answer<T: DeserializeOwned>(
        &self,
        resp: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Option<T>, CliError> {
        let mut resp = resp.map_err(|e| CliError::Unreachable {
            addr: self.addr.clone(),
            reason: e.to_string(),
        })?;
        let status = resp.status().as_u16();
        let bad = |reason: String| CliError::BadAnswer {
            addr: self.addr.clone(),
            reason,
        };
        if status == 204 {
            return Ok(None);
        }
        if (200..300).contains(&status) {
            return resp
                .body_mut()
                .read_json::<T>()
                .map(Some)
                .map_err(|e| bad(e.to_string()));
        }
        match resp.body_mut().read_json::<ErrorBody>() {
            Ok(e) if status == 503 => Err(CliError::NotYet(e.error)),
            Ok(e) => Err(CliError::Refused(e.error)),
            Err(_) => Err(bad(format!("HTTP {status}"))),
        }
    }

    pub(crate) fn get<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>, CliError> {
        self.answer(self.target.get(path).call())
    }

    pub(crate) fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<Option<T>, CliError> {
        self.answer(self.target.post(path).send_json(body))
    }

    fn delete(&self, path: &str) -> Result<(), CliError> {
        self.delete_json::<serde_json::Value>(path).map(|_| ())
    }

    /// A DELETE whose answer carries a body (e.g. the stopped drill's summary).
    fn delete_json<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>, CliError> {
        self.answer(self.target.delete(path).call())
    }
}

/// Asks until the server stops the partitions or `timeout_ms` passes; tells the operator on
/// stderr what is still behind, at most every few seconds.
fn promote_when_caught_up(
    timeout_ms: u64,
    mut ask: impl FnMut() -> Result<CommandReport, CliError>,
) -> Result<CommandReport, CliError> {
    let start = std::time::Instant::now();
    let mut told = None::<std::time::Instant>;
    loop {
        match ask() {
            Err(CliError::NotYet(why)) => {
                let waited_ms = start.elapsed().as_millis() as u64;
                if waited_ms >= timeout_ms {
                    return Err(CliError::PromoteTimeout {
                        waited_ms,
                        last: why,
                    });
                }
                if told.is_none_or(|t| t.elapsed() >= PROMOTE_PROGRESS_EVERY) {
                    eprintln!("waiting for zero lag: {why}");
                    told = Some(std::time::Instant::now());
                }
                std::thread::sleep(PROMOTE_POLL);
            }
            other => return other,
        }
    }
}

pub(crate) fn required<T>(v: Option<T>, addr: &str) -> Result<T, CliError> {
    v.ok_or_else(|| CliError::BadAnswer {
        addr: addr.to_owned(),
        reason: "empty answer".into(),
    })
}

/// Left-aligned columns separated by two spaces.
pub(crate) fn table(
    out: &mut impl Write,
    header: &[&str],
    rows: &[Vec<String>],
) -> std::io::Result<()> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for r in rows {
        writeln!(out, "{}", line(r.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

/// `describe --failed`'s RETRY cell as the KIP tool prints it: `attempt/max`, or
/// `NonRetryable` for failures retrying cannot fix.
fn retry_cell(attempt: i32) -> String {
    if attempt < 0 {
        "NonRetryable".to_owned()
    } else {
        format!("{attempt}/{MIRROR_RETRY_MAX_ATTEMPTS_DEFAULT}")
    }
}

pub(crate) fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// Every action's output: `value` as pretty JSON with `--json`, else what `text` writes.
pub(crate) fn json_or<W: Write, T: Serialize + ?Sized>(
    out: &mut W,
    json: bool,
    value: &T,
    text: impl FnOnce(&mut W) -> Result<(), CliError>,
) -> Result<(), CliError> {
    if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        )?;
        return Ok(());
    }
    text(out)
}

fn print_report(
    out: &mut impl Write,
    json: bool,
    what: &str,
    r: &CommandReport,
) -> Result<(), CliError> {
    json_or(out, json, r, |out| print_report_text(out, what, r))
}

fn print_report_text(out: &mut impl Write, what: &str, r: &CommandReport) -> Result<(), CliError> {
    if r.changed.is_empty() && r.unchanged.is_empty() {
        writeln!(out, "No matching topics found yet for mirror {}.", r.mirror)?;
        return Ok(());
    }
    if !r.changed.is_empty() {
        writeln!(
            out,
            "{what} {} partition(s) of mirror {}: {}",
            r.changed.len(),
            r.mirror,
            r.changed.join(", ")
        )?;
    }
    if !r.unchanged.is_empty() {
        writeln!(out, "Already so: {}", r.unchanged.join(", "))?;
    }
    if let Some(sync) = &r.group_sync {
        writeln!(out, "Last group-offset sync: {sync}")?;
    }
    Ok(())
}

/// Drills as a table: one row per cloned partition, with the drill's disk use.
fn print_drills(out: &mut impl Write, json: bool, drills: &[DrillSummary]) -> Result<(), CliError> {
    json_or(out, json, drills, |out| print_drills_text(out, drills))
}

fn print_drills_text(out: &mut impl Write, drills: &[DrillSummary]) -> Result<(), CliError> {
    if drills.is_empty() {
        writeln!(out, "No drill in progress.")?;
        return Ok(());
    }
    let cells: Vec<Vec<String>> = drills
        .iter()
        .flat_map(|d| {
            d.partitions.iter().map(move |p| {
                vec![
                    d.name.clone(),
                    d.mirror.clone(),
                    format!("{}-{}", p.topic, p.partition),
                    format!("{}-{}", p.clone_topic, p.partition),
                    p.cloned_end.to_string(),
                    p.cost.copied_bytes.to_string(),
                    p.cost.linked_bytes.to_string(),
                    p.group_offsets.to_string(),
                ]
            })
        })
        .collect();
    table(
        out,
        &[
            "DRILL",
            "MIRROR",
            "PARTITION",
            "CLONE",
            "CLONED-AT",
            "COPIED-BYTES",
            "SHARED-BYTES",
            "GROUP-OFFSETS",
        ],
        &cells,
    )?;
    for d in drills {
        writeln!(
            out,
            "Drill {}: {} bytes on disk of its own, {} bytes shared with the mirror by hard links.",
            d.name, d.disk_bytes, d.linked_bytes
        )?;
        if !d.groups_left_alone.is_empty() {
            writeln!(
                out,
                "  Group offsets not copied (members on kmirror at the start): {}",
                d.groups_left_alone.join(", ")
            )?;
        }
    }
    Ok(())
}

/// A loss report as a table: one row per partition, then the totals and what is exact.
fn print_loss(out: &mut impl Write, r: &LossReport) -> Result<(), CliError> {
    let basis = if r.source_answered {
        "the source's high watermarks listed at the stop (exact)".to_owned()
    } else {
        format!(
            "the last high watermarks kmirror saw (the source did not answer: {}); counts are \
             at least, the source may have acknowledged more after SEEN-AGO",
            r.source_error.as_deref().unwrap_or("unknown")
        )
    };
    writeln!(
        out,
        "Loss report of mirror {} at {} ms, against {basis}:",
        r.mirror, r.at_ms
    )?;
    let cells: Vec<Vec<String>> = r
        .partitions
        .iter()
        .map(|p| {
            vec![
                p.topic.clone(),
                p.partition.to_string(),
                opt(p.source_high_watermark),
                opt(p
                    .seen_at_ms
                    .map(|at| format!("{:.1}s", (r.at_ms - at).max(0) as f64 / 1e3))),
                opt(p.local_end),
                match (p.records, p.records_exact) {
                    (Some(n), true) => n.to_string(),
                    (Some(n), false) => format!(">={n}"),
                    (None, _) => "unknown".to_owned(),
                },
                opt(p.bytes_estimate.map(|b| format!("~{b}"))),
                opt(p.seconds_at_most.map(|s| format!("<={s:.1}"))),
                p.verified_through
                    .map_or_else(|| "unknown".to_owned(), |v| v.to_string()),
            ]
        })
        .collect();
    table(
        out,
        &[
            "TOPIC",
            "PARTITION",
            "SOURCE-HW",
            "SEEN-AGO",
            "LOCAL-END",
            "RECORDS-LOST",
            "BYTES",
            "SECONDS",
            "VERIFIED-THROUGH",
        ],
        &cells,
    )?;
    writeln!(
        out,
        "Total: {}{} offsets may be lost{}.",
        if r.exact() { "" } else { "at least " },
        r.total_records(),
        if r.forced {
            " (forced past --max-loss-seconds)"
        } else {
            ""
        }
    )?;
    Ok(())
}

/// A mirror's Kafka-style properties file, bounded and parsed.
fn read_properties(path: &std::path::Path) -> Result<BTreeMap<String, String>, CliError> {
    let meta = std::fs::metadata(path).map_err(|source| CliError::ReadConfig {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.len() > MIRROR_PROPERTIES_BYTES_MAX as u64 {
        return Err(CliError::BadConfig {
            path: path.to_path_buf(),
            reason: format!("larger than {MIRROR_PROPERTIES_BYTES_MAX} bytes"),
        });
    }
    let text = std::fs::read_to_string(path).map_err(|source| CliError::ReadConfig {
        path: path.to_path_buf(),
        source,
    })?;
    parse_properties(&text).map_err(|e| CliError::BadConfig {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Runs one `mirrors` action, writing its result to `out`.
pub fn run(args: &MirrorsArgs, out: &mut impl Write) -> Result<(), CliError> {
    let client = Client::new(args)?;
    let addr = args.admin.as_str();
    match &args.action {
        Action::Create {
            mirror,
            mirror_config,
            start_from,
        } => {
            let mut properties = read_properties(mirror_config)?;
            if let Some(s) = start_from {
                StartFrom::parse(s)
                    .map_err(|e| CliError::BadArgument(format!("--start-from: {e}")))?;
                properties.insert("mirror.start.from".into(), s.clone());
            }
            let body = CreateBody {
                name: mirror.clone(),
                properties,
            };
            let s: MirrorSummary = required(client.post("/mirrors", &body)?, addr)?;
            json_or(out, args.json, &s, |out| {
                writeln!(
                    out,
                    "Created mirror {} (source cluster {}, {}).",
                    s.mirror,
                    opt(s.source_cluster_id.as_ref()),
                    s.source_bootstrap_servers
                )?;
                Ok(())
            })?;
        }
        Action::Repoint {
            mirror,
            mirror_config,
        } => {
            let body = RepointBody {
                properties: read_properties(mirror_config)?,
            };
            let r: RepointReport = required(
                client.post(&format!("/mirrors/{mirror}/repoint"), &body)?,
                addr,
            )?;
            if args.json {
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string_pretty(&r).unwrap_or_default()
                )?;
            } else {
                writeln!(
                    out,
                    "Re-pointed mirror {} at source cluster {} ({}), mirror epoch {}.",
                    r.mirror,
                    opt(r.source_cluster_id),
                    r.source_bootstrap_servers,
                    r.mirror_epoch
                )?;
                for (tp, end) in &r.partitions {
                    writeln!(out, "  {tp}: history agrees; resumes from offset {end}")?;
                }
                for (tp, why) in &r.stopped {
                    writeln!(out, "  {tp}: not re-pointed: {why}")?;
                }
                for hop in &r.lineage {
                    writeln!(
                        out,
                        "  lineage: {} ({}) until mirror epoch {}",
                        opt(hop.cluster_id.clone()),
                        hop.bootstrap_servers,
                        hop.until_mirror_epoch
                    )?;
                }
                for (topic, links) in &r.topic_lineage {
                    writeln!(
                        out,
                        "  lineage of {topic}: {}",
                        crate::control::lineage::chain::show(links)
                    )?;
                }
            }
        }
        Action::Start {
            mirror,
            topics,
            exclude,
        } => {
            let body = TopicsBody {
                topics: topics.clone(),
                exclude: exclude.clone(),
                max_loss_seconds: None,
                force: false,
                cut_at_timestamp: None,
            };
            let r = required(
                client.post(&format!("/mirrors/{mirror}/start"), &body)?,
                addr,
            )?;
            print_report(out, args.json, "Started", &r)?;
        }
        Action::Stop {
            mirror,
            topics,
            promote: true,
            promote_timeout_ms,
            ..
        } => {
            let body = TopicsBody {
                topics: topics.clone(),
                exclude: None,
                max_loss_seconds: None,
                force: false,
                cut_at_timestamp: None,
            };
            let path = format!("/mirrors/{mirror}/promote");
            let r = promote_when_caught_up(*promote_timeout_ms, || {
                required(client.post(&path, &body)?, addr)
            })?;
            print_report(out, args.json, "Promoted (caught up, then stopped)", &r)?;
        }
        Action::Stop {
            mirror,
            topics,
            max_loss_seconds,
            force,
            cut_at_timestamp,
            ..
        } => {
            let body = TopicsBody {
                topics: topics.clone(),
                exclude: None,
                max_loss_seconds: *max_loss_seconds,
                force: *force,
                cut_at_timestamp: *cut_at_timestamp,
            };
            let a: StopAnswer = required(
                client.post(&format!("/mirrors/{mirror}/stop"), &body)?,
                addr,
            )?;
            json_or(out, args.json, &a, |out| {
                print_report_text(out, "Stopped", &a.report)?;
                if let Some(loss) = &a.loss_report {
                    print_loss(out, loss)?;
                }
                if let Some(why) = &a.loss_report_error {
                    writeln!(out, "Loss report NOT stored: {why}")?;
                }
                for c in &a.cut {
                    match &c.quarantine {
                        Some(q) => writeln!(
                            out,
                            "Cut {}-{} at timestamp {}: log end {} -> {}, {} batch(es) / {} record(s) / {} bytes quarantined in {}",
                            c.topic,
                            c.partition,
                            c.cut_at_timestamp,
                            c.log_end_before,
                            c.log_end_after,
                            q.batch_count,
                            q.record_count,
                            q.bytes,
                            q.segment_file.display()
                        )?,
                        None => writeln!(
                            out,
                            "Cut {}-{} at timestamp {}: nothing newer (log end {}){}",
                            c.topic,
                            c.partition,
                            c.cut_at_timestamp,
                            c.log_end_after,
                            if c.holds_a_later_batch {
                                ""
                            } else {
                                "; it may not hold every record up to that time"
                            }
                        )?,
                    }
                }
                Ok(())
            })?;
        }
        Action::Failback { action } => {
            crate::ops::failback_cli::run(&client, addr, args.json, action, out)?;
        }
        Action::Drill { action } => match action {
            DrillAction::Start {
                mirror,
                topics,
                name,
            } => {
                let body = DrillBody {
                    name: name.clone(),
                    mirror: mirror.clone(),
                    topics: topics.clone(),
                };
                let d: DrillSummary = required(client.post("/drills", &body)?, addr)?;
                print_drills(out, args.json, &[d])?;
            }
            DrillAction::Stop { name } => {
                let d: DrillSummary =
                    required(client.delete_json(&format!("/drills/{name}"))?, addr)?;
                json_or(out, args.json, &d, |out| {
                    writeln!(
                        out,
                        "Stopped drill {} (its clones and the group offsets committed on them are deleted).",
                        d.name
                    )?;
                    Ok(())
                })?;
            }
            DrillAction::List => {
                let all: Vec<DrillSummary> = required(client.get("/drills")?, addr)?;
                print_drills(out, args.json, &all)?;
            }
        },
        Action::LossReport { mirror, last } => {
            let mut reports: Vec<LossReport> =
                required(client.get(&format!("/mirrors/{mirror}/loss-report"))?, addr)?;
            if *last {
                let keep = reports.len().saturating_sub(1);
                reports.drain(..keep);
            }
            json_or(out, args.json, &reports, |out| {
                if reports.is_empty() {
                    writeln!(out, "No stop of mirror {mirror} has been reported yet.")?;
                }
                for r in &reports {
                    print_loss(out, r)?;
                }
                Ok(())
            })?;
        }
        Action::Pause { mirror, topics } | Action::Resume { mirror, topics } => {
            let (verb, done) = match &args.action {
                Action::Pause { .. } => ("pause", "Paused"),
                _ => ("resume", "Resumed"),
            };
            let body = TopicsBody {
                topics: topics.clone(),
                exclude: None,
                max_loss_seconds: None,
                force: false,
                cut_at_timestamp: None,
            };
            let r = required(
                client.post(&format!("/mirrors/{mirror}/{verb}"), &body)?,
                addr,
            )?;
            print_report(out, args.json, done, &r)?;
        }
        Action::Delete { mirror } => {
            client.delete(&format!("/mirrors/{mirror}"))?;
            if args.json {
                writeln!(out, "{}", serde_json::json!({ "deleted": mirror }))?;
            } else {
                writeln!(out, "Deleted mirror {mirror}.")?;
            }
        }
        Action::List => {
            let list: Vec<MirrorSummary> = required(client.get("/mirrors")?, addr)?;
            json_or(out, args.json, &list, |out| {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|m| {
                        vec![
                            m.mirror.clone(),
                            m.topics.to_string(),
                            opt(m.source_cluster_id.as_ref()),
                            m.source_bootstrap_servers.clone(),
                        ]
                    })
                    .collect();
                table(
                    out,
                    &[
                        "MIRROR",
                        "TOPICS",
                        "SOURCE-CLUSTER-ID",
                        "SOURCE-BOOTSTRAP-SERVER",
                    ],
                    &rows,
                )?;
                Ok(())
            })?;
        }
        Action::Describe { mirror, failed } => {
            let path = match mirror {
                Some(m) => format!("/describe?mirror={m}"),
                None => "/describe".to_owned(),
            };
            let mut rows: Vec<PartitionRow> = required(client.get(&path)?, addr)?;
            if *failed {
                rows.retain(|r| r.state == crate::control::state::StateName::Failed);
            }
            if args.json {
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string_pretty(&rows).unwrap_or_default()
                )?;
            } else if *failed {
                let cells: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|r| {
                        vec![
                            r.mirror,
                            r.topic,
                            r.partition.to_string(),
                            retry_cell(r.retry_attempt),
                            opt(r.error_message),
                        ]
                    })
                    .collect();
                table(
                    out,
                    &["MIRROR", "TOPIC", "PARTITION", "RETRY", "ERROR"],
                    &cells,
                )?;
            } else {
                let acl_lines = acl_sync_lines(&rows);
                let lineage_lines = lineage_lines(&rows);
                let cells: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|r| {
                        vec![
                            r.mirror,
                            r.topic,
                            r.partition.to_string(),
                            opt(r.source_offset),
                            opt(r.destination_offset),
                            opt(r.lag),
                            r.state.to_string(),
                            opt(r.lag_seconds.map(|s| format!("{s:.1}"))),
                            opt(r.verified_offset),
                            opt(r
                                .error_message
                                .or_else(|| r.config_error.map(|e| format!("topic configs: {e}")))),
                        ]
                    })
                    .collect();
                table(
                    out,
                    &[
                        "MIRROR",
                        "TOPIC",
                        "PARTITION",
                        "SOURCE-OFFSET",
                        "DESTINATION-OFFSET",
                        "LAG",
                        "STATE",
                        "LAG-SECONDS",
                        "VERIFIED-OFFSET",
                        "ERROR",
                    ],
                    &cells,
                )?;
                for line in acl_lines.into_iter().chain(lineage_lines) {
                    writeln!(out, "{line}")?;
                }
                // Drills in progress, with their disk use (an older kmirror has no /drills).
                if let Ok(Some(drills)) = client.get::<Vec<DrillSummary>>("/drills") {
                    if !drills.is_empty() {
                        writeln!(out)?;
                        print_drills(out, false, &drills)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// One line per mirrored topic with its upstream chain (`control::lineage::chain`).
fn lineage_lines(rows: &[PartitionRow]) -> Vec<String> {
    let mut seen = std::collections::BTreeMap::new();
    for r in rows.iter().filter(|r| !r.lineage.is_empty()) {
        seen.entry((r.mirror.clone(), r.topic.clone()))
            .or_insert_with(|| crate::control::lineage::chain::show(&r.lineage));
    }
    seen.into_iter()
        .map(|((mirror, topic), chain)| format!("Lineage of {topic} ({mirror}): {chain}"))
        .collect()
}

/// One line per mirror about its ACL sync from the source (from the first row of each).
fn acl_sync_lines(rows: &[PartitionRow]) -> Vec<String> {
    let mut seen = std::collections::BTreeMap::new();
    for r in rows {
        if let Some(a) = &r.acl_sync {
            seen.entry(r.mirror.clone()).or_insert_with(|| {
                let mut line = format!(
                    "ACL sync of {}: {}, {} synced ACLs in force",
                    r.mirror, a.state, a.synced
                );
                if let Some(ms) = a.last_sync_ms {
                    line.push_str(&format!(", last sync at {ms} ms"));
                }
                if let Some(m) = &a.message {
                    line.push_str(&format!("; {m}"));
                }
                if let Some(e) = &a.error {
                    line.push_str(&format!("; last error: {e}"));
                }
                line
            });
        }
    }
    seen.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    fn rewritten(s: &str) -> String {
        let out = accept_action_flags(argv(s)).unwrap();
        let words: Vec<String> = out
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        words.join(" ")
    }

    #[test]
    fn the_kip_action_flag_becomes_the_subcommand() {
        assert_eq!(
            rewritten("kmirror mirrors --describe --mirror m --json"),
            "kmirror mirrors describe --mirror m --json"
        );
        assert_eq!(
            rewritten("kmirror mirrors --bootstrap-server h:1 --stop --mirror m --topics .*"),
            "kmirror mirrors stop --bootstrap-server h:1 --mirror m --topics .*"
        );
        assert_eq!(rewritten("kmirror mirrors --list"), "kmirror mirrors list");
    }

    #[test]
    fn values_and_the_subcommand_form_are_left_alone() {
        for same in [
            "kmirror mirrors describe --mirror m",
            "kmirror mirrors start --mirror m --topics --list",
            "kmirror serve --config --list",
            "kmirror mirrors --admin h:1 list",
        ] {
            assert_eq!(rewritten(same), same);
        }
        // A value that looks like an action flag stays a value.
        assert_eq!(
            rewritten("kmirror mirrors --start --mirror-name --stop --topics t"),
            "kmirror mirrors start --mirror-name --stop --topics t"
        );
    }

    #[test]
    fn two_actions_are_refused() {
        let e = accept_action_flags(argv("kmirror mirrors --start --stop --mirror m"));
        assert!(
            matches!(&e, Err(CliError::BadArgument(m)) if m.contains("--start and --stop")),
            "{e:?}"
        );
    }

    #[test]
    fn retry_cell_shows_attempt_of_max_or_non_retryable() {
        assert_eq!(retry_cell(-1), "NonRetryable");
        assert_eq!(
            retry_cell(3),
            format!("3/{MIRROR_RETRY_MAX_ATTEMPTS_DEFAULT}")
        );
    }
}
