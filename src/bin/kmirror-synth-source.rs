//! A synthetic Kafka source for benchmarks: serves pre-built compressed batches from memory.

use clap::Parser;
use kmirror::bench::server::SynthServer;
use kmirror::bench::spec::SynthArgs;

#[derive(Debug, Parser)]
#[command(about = "Serve a synthetic Kafka topic from in-memory compressed batches")]
struct Cli {
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:9092")]
    listen: String,
    /// Print `first_records_at=<unix s>` when the first response with records is sent and
    /// `all_served_at=<unix s>` once every partition was served to its end (benchmarks time a
    /// mirror by them instead of walking its data dir).
    #[arg(long)]
    announce_progress: bool,
    /// Refuse fetch sessions (KIP-227), as a broker with a full session cache does: every
    /// client then sends full fetches.
    #[arg(long)]
    no_fetch_sessions: bool,
    /// Emulate a long-distance link: answer each Fetch this many ms after it came in...
    #[arg(long)]
    link_rtt_ms: Option<u64>,
    /// ...and send at most this many MB/s (10^6 bytes) over it.
    #[arg(long, requires = "link_rtt_ms")]
    link_mb_s: Option<f64>,
    #[command(flatten)]
    synth: SynthArgs,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let mut server = SynthServer::bind(&cli.listen, cli.synth.to_spec())?;
    if cli.no_fetch_sessions {
        server = server.without_fetch_sessions();
    }
    if let Some(rtt) = cli.link_rtt_ms {
        server = server.over_link(kmirror::bench::server::Link {
            rtt: std::time::Duration::from_millis(rtt),
            bytes_per_s: cli.link_mb_s.map_or(u64::MAX, |r| (r * 1e6) as u64),
        });
    }
    let c = server.catalog();
    if cli.announce_progress {
        c.progress.announce();
    }
    println!(
        "listening on {} batch_bytes={} records_per_batch={} batches_per_partition={} rate_mb_s={} fetch_sessions={}",
        server.local_addr(),
        c.template.size(),
        c.template.records_per_batch(),
        c.batches_per_partition
            .map_or("endless".to_string(), |n| n.to_string()),
        cli.synth
            .rate_mb_s
            .map_or("unlimited".to_string(), |r| r.to_string()),
        !cli.no_fetch_sessions,
    );
    server.run()?;
    Ok(())
}
