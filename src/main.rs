//! The `kmirror` binary: parses the command line and hands off to the library.

use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// kmirror: a Kafka cluster-mirroring destination appliance.
#[derive(Debug, Parser)]
#[command(name = "kmirror", version, about)]
struct Cli {}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KMIRROR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let _cli = Cli::parse();
}
