//! `kmirror mirrors failback create|start|describe|stop` (design in `control::failback`), kept
//! apart from the other `mirrors` actions.

use std::io::Write;

use clap::Subcommand;

use crate::control::admin_failback::FailbackBody;
use crate::control::failback::FailbackReport;
use crate::limits::FAILBACK_STOP_TIMEOUT_MS_DEFAULT;
use crate::ops::mirrors_cli::{json_or, opt, required, table, CliError, Client};

#[derive(Debug, Subcommand)]
pub enum FailbackAction {
    /// Plan the failback of the mirror's STOPPED partitions of the matching topics and report
    /// the original's divergent tail (what it holds past the failover point that kmirror never
    /// received; it stays there). Nothing is written to the original.
    Create {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: String,
        #[arg(long, default_value = ".*")]
        topics: String,
    },
    /// Start copying (and keep copying new writes) to the original.
    Start {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: String,
    },
    /// The divergent tail, the copy's progress and reverse lag per partition, the groups moved.
    Describe {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: String,
    },
    /// Cut over: after producers on kmirror stopped, wait for zero reverse lag, then move the
    /// consumer groups' offsets to the original (translated) and stop copying.
    Stop {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: String,
        #[arg(long, default_value_t = FAILBACK_STOP_TIMEOUT_MS_DEFAULT)]
        timeout_ms: u64,
    },
}

pub(crate) fn run(
    client: &Client,
    addr: &str,
    json: bool,
    action: &FailbackAction,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let report: FailbackReport = match action {
        FailbackAction::Create { mirror, topics } => {
            let body = FailbackBody {
                topics: Some(topics.clone()),
                timeout_ms: None,
            };
            required(
                client.post(&format!("/mirrors/{mirror}/failback/create"), &body)?,
                addr,
            )?
        }
        FailbackAction::Start { mirror } => required(
            client.post(
                &format!("/mirrors/{mirror}/failback/start"),
                &FailbackBody::default(),
            )?,
            addr,
        )?,
        FailbackAction::Describe { mirror } => {
            required(client.get(&format!("/mirrors/{mirror}/failback"))?, addr)?
        }
        FailbackAction::Stop { mirror, timeout_ms } => {
            let body = FailbackBody {
                topics: None,
                timeout_ms: Some(*timeout_ms),
            };
            required(
                client.post(&format!("/mirrors/{mirror}/failback/stop"), &body)?,
                addr,
            )?
        }
    };
    print(out, json, &report)
}

fn print<W: Write>(out: &mut W, json: bool, r: &FailbackReport) -> Result<(), CliError> {
    json_or(out, json, r, |out| print_table(out, r))
}

fn print_table(out: &mut impl Write, r: &FailbackReport) -> Result<(), CliError> {
    writeln!(
        out,
        "Failback of mirror {}: {:?}{}{}",
        r.mirror,
        r.phase,
        if r.caught_up { ", caught up" } else { "" },
        r.error
            .as_deref()
            .map(|e| format!(", last error: {e}"))
            .unwrap_or_default()
    )?;
    writeln!(out, "Divergent tail (on the original past the failover point, never on kmirror; left in place):")?;
    let tails: Vec<Vec<String>> = r
        .partitions
        .iter()
        .map(|p| {
            let t = &p.divergent_tail;
            vec![
                p.topic.clone(),
                p.partition.to_string(),
                format!("{}..{}", t.from_offset, t.to_offset),
                t.offsets.to_string(),
                format!("{}{}", t.records, if t.scan_complete { "" } else { "+" }),
                format!(
                    "{}..{}",
                    opt(t.first_timestamp_ms),
                    opt(t.last_timestamp_ms)
                ),
            ]
        })
        .collect();
    table(
        out,
        &[
            "TOPIC",
            "PARTITION",
            "OFFSETS",
            "OFFSET-COUNT",
            "RECORDS",
            "TIMESTAMPS-MS",
        ],
        &tails,
    )?;
    writeln!(out, "Copy:")?;
    let rows: Vec<Vec<String>> = r
        .partitions
        .iter()
        .map(|p| {
            vec![
                p.topic.clone(),
                p.partition.to_string(),
                p.failover_point.to_string(),
                opt(p.kmirror_end),
                p.copied_through.to_string(),
                opt(p.lag),
                p.copied_records.to_string(),
                format!("{}..{}", p.original_copy_base, p.original_next),
                p.error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "TOPIC",
            "PARTITION",
            "FAILOVER-POINT",
            "KMIRROR-END",
            "COPIED-THROUGH",
            "LAG",
            "RECORDS",
            "ORIGINAL-OFFSETS",
            "ERROR",
        ],
        &rows,
    )?;
    if !r.groups.is_empty() {
        writeln!(out, "Groups:")?;
        let g: Vec<Vec<String>> = r
            .groups
            .iter()
            .map(|g| {
                vec![
                    g.group.clone(),
                    g.topic.clone(),
                    g.partition.to_string(),
                    g.kmirror_offset.to_string(),
                    opt(g.original_offset),
                    g.outcome.clone(),
                ]
            })
            .collect();
        table(
            out,
            &[
                "GROUP",
                "TOPIC",
                "PARTITION",
                "KMIRROR-OFFSET",
                "ORIGINAL-OFFSET",
                "OUTCOME",
            ],
            &g,
        )?;
    }
    Ok(())
}
