//! The raw-copy limit: fetch from the synthetic source and write the response bytes to files,
//! with no parsing or validation. Pass the same data flags as to `kmirror-synth-source`.
//! With `--from-broker`, copy `--topic`'s `--partitions` from a real Kafka broker instead, from
//! offset 0 to the high watermark (`bench::raw_copy_broker`: only the batch headers are read).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kmirror::bench::raw_copy::{self, RawCopyConfig};
use kmirror::bench::raw_copy_broker::{self, BrokerCopyConfig};
use kmirror::bench::spec::SynthArgs;

#[derive(Debug, Parser)]
#[command(about = "Fetch from a synthetic source and write raw responses to disk")]
struct Cli {
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    #[command(flatten)]
    synth: SynthArgs,
    #[arg(long, default_value_t = 17)]
    fetch_version: i16,
    /// Fetch max_bytes (response budget).
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    max_bytes: i32,
    #[arg(long, default_value_t = 1024 * 1024)]
    partition_max_bytes: i32,
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Directory for the output files (raw-copy-<n>.bin); without it the bytes are discarded.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Reserve disk blocks ahead of each output file's end, as kmirror's active segments do.
    #[arg(long)]
    preallocate: bool,
    /// Byte offset in the read buffer at which the socket's bytes land (64: at 0 the kernel's
    /// copy of some streams costs twice as much on some CPUs; benches/RESULTS.md, session 26).
    #[arg(long, default_value_t = kmirror::limits::RAW_COPY_READ_OFFSET_BYTES)]
    read_offset: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Stop after this many GB in all.
    #[arg(long)]
    max_gb: Option<f64>,
    /// Copy from a real Kafka broker leading every partition of the (first) `--topic`, from
    /// offset 0 to each partition's high watermark, with Fetch v12; the other data flags are
    /// ignored.
    #[arg(long)]
    from_broker: bool,
    /// With `--from-broker`: full fetches every time instead of KIP-227 incremental sessions.
    #[arg(long)]
    no_fetch_sessions: bool,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.from_broker {
        return from_broker(cli);
    }
    let mut config = RawCopyConfig::new(cli.bootstrap, cli.synth.to_spec());
    config.fetch_version = cli.fetch_version;
    config.max_bytes = cli.max_bytes;
    config.partition_max_bytes = cli.partition_max_bytes;
    config.connections = cli.connections;
    config.out_dir = cli.out_dir;
    config.preallocate = cli.preallocate;
    config.read_offset = cli.read_offset;
    config.duration = Duration::from_secs_f64(cli.seconds);
    if let Some(gb) = cli.max_gb {
        config.max_total_bytes = (gb * 1e9) as u64;
    }
    let report = raw_copy::run(&config)?;
    println!(
        "raw-copy bytes={} responses={} batches={} seconds={:.3} MB/s={:.1} batches/s={:.0} cpu_s={} cpu_s_per_GB={}",
        report.bytes,
        report.responses,
        report.batches,
        report.elapsed.as_secs_f64(),
        report.mb_per_s(),
        report.batches_per_s(),
        report.cpu_seconds.map_or("n/a".into(), |c| format!("{c:.2}")),
        report.cpu_seconds_per_gb().map_or("n/a".into(), |c| format!("{c:.3}")),
    );
    Ok(())
}

fn from_broker(cli: Cli) -> anyhow::Result<()> {
    let topic = cli
        .synth
        .topics
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("--from-broker needs --topic"))?;
    let mut config = BrokerCopyConfig::new(cli.bootstrap, topic, cli.synth.partitions);
    config.max_bytes = cli.max_bytes;
    config.partition_max_bytes = cli.partition_max_bytes;
    config.connections = cli.connections;
    config.sessions = !cli.no_fetch_sessions;
    config.out_dir = cli.out_dir;
    config.duration = Duration::from_secs_f64(cli.seconds);
    let report = raw_copy_broker::run(&config)?;
    println!(
        "raw-copy-broker record_bytes={} response_bytes={} responses={} seconds={:.3} MB/s={:.1} cpu_s={} cpu_s_per_GB={}",
        report.record_bytes,
        report.response_bytes,
        report.responses,
        report.elapsed.as_secs_f64(),
        report.mb_per_s(),
        report.cpu_seconds.map_or("n/a".into(), |c| format!("{c:.2}")),
        report.cpu_seconds_per_gb().map_or("n/a".into(), |c| format!("{c:.3}")),
    );
    Ok(())
}
