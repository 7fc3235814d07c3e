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
    /// Mirror the configured source topics into the data dir until SIGTERM/SIGINT.
    Serve {
        /// TOML configuration file (see README "Configuration").
        #[arg(long)]
        config: PathBuf,
    },
}

fn serve(config: &std::path::Path) -> anyhow::Result<()> {
    let config = kmirror::config::ServeConfig::load(config)?;
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    let summary = kmirror::control::mirror_run::run(&config, &stop)?;
    tracing::info!(
        partitions = summary.partitions,
        stopped = summary.stopped.len(),
        "stopped cleanly"
    );
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KMIRROR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve { config } => serve(&config),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kmirror: {e:#}");
            ExitCode::FAILURE
        }
    }
}
