//! The `kmirror` binary: parses the command line and hands off to the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::{Parser, Subcommand};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// kmirror: a Kafka cluster-mirroring destination appliance.
#[derive(Debug, Parser)]
#[command(name = "kmirror", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Mirror into the data dir until SIGTERM/SIGINT: the mirrors managed through the admin API
    /// (`[admin]` configured), or else the configured `[source]` topics.
    Serve {
        /// TOML configuration file (see README "Configuration").
        #[arg(long)]
        config: PathBuf,
    },
    /// Offline tools for partition directories in Kafka's format.
    #[command(subcommand)]
    Log(LogCommand),
    /// Manage mirrors through a running kmirror's admin API (create, start, pause, resume,
    /// stop, delete, list, describe; kafka-cluster-mirrors.sh's `--describe` etc. work too).
    Mirrors(kmirror::ops::mirrors_cli::MirrorsArgs),
    /// The integrity audit of a running kmirror: `kmirror audit report --mirror M [--json]`.
    Audit(kmirror::ops::audit_cli::AuditArgs),
    /// Check this host against a serve config: io_uring, memlock, cores, data dir, sources.
    /// Prints pass/warn/fail lines (failures with their fix); exits non-zero on any failure.
    Doctor {
        /// The `kmirror serve` TOML configuration.
        config: PathBuf,
    },
    /// Print the percentile table of an HdrHistogram interval log (e.g. one that `serve` wrote
    /// under <data_dir>/latency/).
    Latency {
        /// The interval log (`.hlog`).
        file: PathBuf,
        /// Also draw the percentile distribution to this file (.svg or .png).
        #[arg(long)]
        plot: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum LogCommand {
    /// Check a partition directory (CRCs, offsets, indexes, epochs); exits non-zero naming the
    /// first problem.
    Verify { dir: PathBuf },
    /// Print one line per batch of every segment.
    Dump { dir: PathBuf },
}

fn serve(config: &std::path::Path) -> anyhow::Result<()> {
    let config = kmirror::config::ServeConfig::load(config)?;
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    // Choose the CRC-32C kernel now, not on a shard's first batch (it times both, ~1 ms).
    let crc = kmirror::wire::crc32c::choice();
    tracing::info!(
        kernel = crc.kernel.name(),
        fusion_us = crc.best[0].as_micros() as u64,
        folding_us = crc.best[1].as_micros() as u64,
        "CRC-32C kernel chosen"
    );
    if config.admin.is_some() {
        kmirror::control::control_run::run(&config, &stop)?;
        tracing::info!("stopped cleanly");
        return Ok(());
    }
    let summary = kmirror::control::mirror_run::run(&config, &stop)?;
    tracing::info!(
        partitions = summary.partitions,
        stopped = summary.stopped.len(),
        "stopped cleanly"
    );
    Ok(())
}

fn doctor(config: &std::path::Path) -> anyhow::Result<bool> {
    let config = kmirror::config::ServeConfig::load(config)?;
    let findings = kmirror::ops::doctor::diagnose(&config);
    Ok(kmirror::ops::doctor::print(
        &findings,
        &mut std::io::stdout().lock(),
    )?)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KMIRROR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    // `kmirror mirrors --describe ...` (the KIP tool's spelling) as `kmirror mirrors describe`.
    let argv = match kmirror::ops::mirrors_cli::accept_action_flags(std::env::args_os().collect()) {
        Ok(argv) => argv,
        Err(e) => {
            eprintln!("kmirror: {e}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(argv);
    let result = match cli.command {
        Command::Mirrors(args) => {
            kmirror::ops::mirrors_cli::run(&args, &mut std::io::stdout().lock())
                .map_err(anyhow::Error::from)
        }
        Command::Audit(args) => kmirror::ops::audit_cli::run(&args, &mut std::io::stdout().lock())
            .map_err(anyhow::Error::from),
        Command::Serve { config } => serve(&config),
        Command::Doctor { config } => {
            return match doctor(&config) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("kmirror: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
        Command::Latency { file, plot } => {
            kmirror::ops::latency_cmd::run(&file, plot.as_deref(), &mut std::io::stdout().lock())
                .map_err(anyhow::Error::from)
        }
        Command::Log(LogCommand::Verify { dir }) => kmirror::ops::log_tools::verify(&dir)
            .map(|summary| println!("{summary}"))
            .map_err(anyhow::Error::from),
        Command::Log(LogCommand::Dump { dir }) => {
            kmirror::ops::log_tools::dump(&dir, &mut std::io::stdout().lock())
                .map_err(anyhow::Error::from)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kmirror: {e:#}");
            ExitCode::FAILURE
        }
    }
}
