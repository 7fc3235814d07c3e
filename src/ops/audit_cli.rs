//! `kmirror audit report --mirror M [--json]`: the integrity audit of a running kmirror, from
//! its admin API (`GET /mirrors/{name}/audit`): per partition how far the copy is verified
//! against the source, what the audit read and fetched, and every mismatch or damaged batch
//! it found (kept in memory since the process started, at most `AUDIT_EVENTS_MAX`).

use std::io::Write;

use clap::{Args, Subcommand};

use crate::control::audit::AuditReport;
use crate::ops::mirrors_cli::{opt, required, table, CliError, Client, DEFAULT_ADMIN};

#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(subcommand)]
    pub action: AuditAction,
    /// The admin API of the kmirror to ask (host:port of `[admin] listen`).
    #[arg(long, global = true, default_value = DEFAULT_ADMIN, visible_alias = "bootstrap-server")]
    pub admin: String,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// As `kmirror mirrors --admin-token-file`.
    #[arg(long, global = true, env = "KMIRROR_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<std::path::PathBuf>,
    /// As `kmirror mirrors --admin-ca-file`.
    #[arg(long, global = true, env = "KMIRROR_ADMIN_CA_FILE")]
    pub admin_ca_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum AuditAction {
    /// Verified-through offsets, audit bytes, mismatches and damaged batches of one mirror.
    Report {
        #[arg(long, visible_alias = "mirror-name")]
        mirror: String,
    },
}

pub fn run(args: &AuditArgs, out: &mut impl Write) -> Result<(), CliError> {
    let client = Client::connect(
        &args.admin,
        args.admin_token_file.as_deref(),
        args.admin_ca_file.as_deref(),
    )?;
    match &args.action {
        AuditAction::Report { mirror } => {
            let report: AuditReport = required(
                client.get(&format!("/mirrors/{mirror}/audit"))?,
                &args.admin,
            )?;
            if args.json {
                serde_json::to_writer_pretty(&mut *out, &report)
                    .map_err(|e| CliError::Output(e.into()))?;
                writeln!(out)?;
                return Ok(());
            }
            let s = &report.settings;
            writeln!(
                out,
                "Audit of mirror {}: {} (every {} ms, {} bytes/s); read {} bytes locally, fetched {} bytes from the source; {} mismatch(es)",
                report.mirror,
                if s.enabled { "on" } else { "off" },
                s.interval_ms,
                s.bytes_per_sec,
                report.bytes_read,
                report.bytes_fetched,
                report.mismatches
            )?;
            let cells: Vec<Vec<String>> = report
                .partitions
                .iter()
                .map(|p| {
                    vec![
                        p.topic.clone(),
                        p.partition.to_string(),
                        opt(p.verified_offset),
                        opt(p.verified_timestamp_ms),
                        opt(p.log_end_offset),
                        p.bytes_read.to_string(),
                        p.bytes_fetched.to_string(),
                        p.mismatches.to_string(),
                        opt(p.note.clone()),
                    ]
                })
                .collect();
            table(
                out,
                &[
                    "TOPIC",
                    "PARTITION",
                    "VERIFIED-OFFSET",
                    "VERIFIED-SOURCE-TIMESTAMP-MS",
                    "LOG-END-OFFSET",
                    "BYTES-READ",
                    "BYTES-FETCHED",
                    "MISMATCHES",
                    "NOTE",
                ],
                &cells,
            )?;
            if !report.events.is_empty() {
                writeln!(out)?;
                let cells: Vec<Vec<String>> = report
                    .events
                    .iter()
                    .map(|e| {
                        vec![
                            e.at_ms.to_string(),
                            e.topic.clone(),
                            e.partition.to_string(),
                            e.kind.clone(),
                            e.message.clone(),
                        ]
                    })
                    .collect();
                table(
                    out,
                    &["AT-MS", "TOPIC", "PARTITION", "KIND", "EVENT"],
                    &cells,
                )?;
            }
        }
    }
    Ok(())
}
