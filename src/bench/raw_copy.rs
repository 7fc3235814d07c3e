//! The raw-copy limit client: sends the same Fetch requests a mirror would and writes the raw
//! response bytes to a file, with no parsing, no validation and no index. Its MB/s against the
//! synthetic source is the denominator of kmirror's throughput ratio.
//!
//! It never looks inside a response. It knows where each partition's next fetch starts because
//! it shares the source's [`SynthSpec`] and runs the source's own response planner; the length
//! prefix of every response must then equal the planned size, which is the only check it makes.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;

use super::fetch_response::{self, ResponseFrame, Served};
use super::records::Catalog;
use super::{SynthError, SynthSpec};
use crate::ids::Offset;
use crate::limits::{FETCH_RESPONSE_BYTES_MAX, RAW_COPY_CHUNK_BYTES, RAW_COPY_READ_OFFSET_BYTES};
use crate::log::preallocate::{self, Reserved};
use crate::wire::frame::encode_request;

/// What the raw-copy client fetches and where it puts the bytes.
#[derive(Debug, Clone)]
pub struct RawCopyConfig {
    pub bootstrap: String,
    pub spec: SynthSpec,
    pub fetch_version: i16,
    pub max_bytes: i32,
    pub partition_max_bytes: i32,
    pub max_wait_ms: i32,
    /// Connections, each fetching an equal share of the partitions on its own thread.
    pub connections: usize,
    /// Directory for one output file per connection; `None` discards the bytes (network only).
    pub out_dir: Option<PathBuf>,
    /// Stop after this long (checked between responses).
    pub duration: Duration,
    /// Stop after this many response bytes in all (keeps disk use bounded).
    pub max_total_bytes: u64,
    /// Reserve disk blocks ahead of each output file's end as kmirror's active segments do
    /// (`log::preallocate`), so the copy limit gets the same filesystem help.
    pub preallocate: bool,
    /// Byte offset in the read buffer at which the socket's bytes land
    /// (`RAW_COPY_READ_OFFSET_BYTES` by default; see there why not 0).
    pub read_offset: usize,
}

impl RawCopyConfig {
    pub fn new(bootstrap: impl Into<String>, spec: SynthSpec) -> RawCopyConfig {
        RawCopyConfig {
            bootstrap: bootstrap.into(),
            spec,
            fetch_version: 17,
            max_bytes: FETCH_RESPONSE_BYTES_MAX as i32,
            partition_max_bytes: 1024 * 1024,
            max_wait_ms: 500,
            connections: 1,
            out_dir: None,
            duration: Duration::from_secs(10),
            max_total_bytes: u64::MAX,
            preallocate: false,
            read_offset: RAW_COPY_READ_OFFSET_BYTES,
        }
    }
}

/// What one run moved.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawCopyReport {
    /// Response bytes received and written (length prefixes included).
    pub bytes: u64,
    pub responses: u64,
    /// Record batches the responses carried (from the plan, not from parsing).
    pub batches: u64,
    pub elapsed: Duration,
    /// CPU seconds (user + system) of the whole process during the copy, template building
    /// excluded; `None` where /proc is unavailable.
    pub cpu_seconds: Option<f64>,
}

impl RawCopyReport {
    pub fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn batches_per_s(&self) -> f64 {
        self.batches as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn cpu_seconds_per_gb(&self) -> Option<f64> {
        let gb = self.bytes as f64 / 1e9;
        self.cpu_seconds.filter(|_| gb > 0.0).map(|c| c / gb)
    }
}

/// CPU seconds (user + system) this process has used, from /proc/self/stat. Linux reports them
/// in USER_HZ ticks, which is 100 on every architecture kmirror targets.
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Runs `copy(i, share)` for every connection `i` on a thread of its own, `share` being every
/// `connections`-th item of `items` from the `i`-th; returns their results in connection
/// order, the time they took together and the process's CPU seconds meanwhile.
pub(crate) fn run_connections<T: Copy + Send + Sync, R: Send>(
    connections: usize,
    items: &[T],
    copy: impl Fn(usize, Vec<T>) -> R + Sync,
) -> (Vec<R>, Duration, Option<f64>) {
    let cpu_before = process_cpu_seconds();
    let start = Instant::now();
    let copy = &copy;
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = (0..connections)
            .map(|i| {
                let mine: Vec<T> = items.iter().copied().skip(i).step_by(connections).collect();
                s.spawn(move || copy(i, mine))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("raw-copy thread panicked"))
            .collect::<Vec<_>>()
    });
    let cpu = cpu_before.zip(process_cpu_seconds()).map(|(a, b)| b - a);
    (results, start.elapsed(), cpu)
}

/// Runs the configured connections to completion and sums their figures.
pub fn run(config: &RawCopyConfig) -> Result<RawCopyReport, SynthError> {
    let catalog = Catalog::new(config.spec.clone())?;
    if config.spec.rate_bytes_per_s.is_some() {
        // Its offsets come from the source's planner, which cannot know when a rate-limited
        // source's batches appear.
        return Err(SynthError::BadSpec(
            "the raw-copy client measures the unlimited source only (no --rate-mb-s)".into(),
        ));
    }
    if config.connections == 0 {
        return Err(SynthError::BadSpec(
            "at least one connection is needed".into(),
        ));
    }
    let all: Vec<(usize, i32)> = (0..config.spec.topics.len())
        .flat_map(|t| (0..config.spec.partitions as i32).map(move |p| (t, p)))
        .collect();
    let per_conn = config.max_total_bytes / config.connections as u64;
    let (reports, elapsed, cpu_seconds) = run_connections(config.connections, &all, |i, mine| {
        copy_connection(config, &catalog, i, mine, per_conn)
    });
    let mut total = RawCopyReport {
        elapsed,
        cpu_seconds,
        ..RawCopyReport::default()
    };
    for r in reports {
        let r = r?;
        total.bytes += r.bytes;
        total.responses += r.responses;
        total.batches += r.batches;
    }
    Ok(total)
}

fn fetch_request(
    config: &RawCopyConfig,
    catalog: &Catalog,
    parts: &[(usize, i32)],
    offsets: &[Offset],
    rotate: usize,
) -> FetchRequest {
    // Rotating the partition order spreads a response's byte budget over all partitions, as a
    // broker's fetch session does; otherwise the first partitions would starve the rest.
    let mut topics: Vec<FetchTopic> = Vec::new();
    for k in 0..parts.len() {
        let i = (k + rotate) % parts.len();
        let (t, p) = parts[i];
        let name = &catalog.spec.topics[t];
        let partition = FetchPartition::default()
            .with_partition(p)
            .with_fetch_offset(offsets[i].0)
            .with_partition_max_bytes(config.partition_max_bytes);
        match topics.last_mut() {
            Some(last) if last_topic_matches(last, config.fetch_version, name) => {
                last.partitions.push(partition)
            }
            _ => {
                let mut ft = FetchTopic::default();
                if config.fetch_version >= 13 {
                    ft.topic_id = SynthSpec::topic_id(name);
                } else {
                    ft.topic = TopicName(StrBytes::from_string(name.clone()));
                }
                ft.partitions.push(partition);
                topics.push(ft);
            }
        }
    }
    FetchRequest::default()
        .with_max_wait_ms(config.max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(config.max_bytes)
        .with_topics(topics)
}

fn last_topic_matches(t: &FetchTopic, version: i16, name: &str) -> bool {
    if version >= 13 {
        t.topic_id == SynthSpec::topic_id(name)
    } else {
        t.topic.as_str() == name
    }
}

/// One connection's output file, appended to.
struct OutFile {
    file: File,
    len: u64,
    reserved: Option<Reserved>,
}

impl OutFile {
    fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        let end = self.len + data.len() as u64;
        if let Some((pos, len)) = self.reserved.as_mut().and_then(|r| r.plan(end, u64::MAX)) {
            // A hint, as for a segment: the write reports what matters.
            let _ = preallocate::reserve(&self.file, pos, len);
        }
        self.file.write_all(data)?;
        self.len = end;
        Ok(())
    }
}

fn copy_connection(
    config: &RawCopyConfig,
    catalog: &Catalog,
    index: usize,
    parts: Vec<(usize, i32)>,
    max_bytes: u64,
) -> Result<RawCopyReport, SynthError> {
    let mut report = RawCopyReport::default();
    if parts.is_empty() {
        return Ok(report);
    }
    let mut stream = TcpStream::connect(&config.bootstrap)?;
    stream.set_nodelay(true)?;
    let mut out: Option<OutFile> = match &config.out_dir {
        Some(dir) => Some(OutFile {
            file: File::create(dir.join(format!("raw-copy-{index}.bin")))?,
            len: 0,
            reserved: config.preallocate.then(|| Reserved::new(0)),
        }),
        None => None,
    };
    let client_id = StrBytes::from_static_str("kmirror-raw-copy");
    let leo = catalog.log_end_offset();
    let mut offsets = vec![Offset::ZERO; parts.len()];
    let mut request = BytesMut::new();
    let mut planned = ResponseFrame::default();
    let mut served: Vec<Served> = Vec::new();
    let mut buffer = vec![0u8; config.read_offset + RAW_COPY_CHUNK_BYTES];
    let chunk = &mut buffer[config.read_offset..];
    let start = Instant::now();
    let mut correlation = 0i32;
    while start.elapsed() < config.duration
        && report.bytes < max_bytes
        && offsets.iter().any(|&o| o < leo)
    {
        let rotate = correlation as usize % parts.len();
        let req = fetch_request(config, catalog, &parts, &offsets, rotate);
        request.clear();
        encode_request(
            &mut request,
            config.fetch_version,
            correlation,
            &client_id,
            &req,
        )
        .map_err(|e| SynthError::Encode {
            what: "fetch request",
            reason: e.to_string(),
        })?;
        stream.write_all(&request)?;

        fetch_response::build(
            catalog,
            correlation,
            config.fetch_version,
            &req,
            &mut planned,
            &mut served,
        )?;
        for (k, s) in served.iter().enumerate() {
            offsets[(k + rotate) % parts.len()] = s.next_offset;
        }

        let mut prefix = [0u8; 4];
        stream.read_exact(&mut prefix)?;
        let got = i32::from_be_bytes(prefix).max(0) as usize + 4;
        if got != planned.len() {
            return Err(SynthError::UnexpectedResponseSize {
                expected: planned.len(),
                got,
            });
        }
        if let Some(f) = out.as_mut() {
            f.write_all(&prefix)?;
        }
        let mut left = got - 4;
        while left > 0 {
            let want = left.min(chunk.len());
            let n = stream.read(&mut chunk[..want])?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
            if let Some(f) = out.as_mut() {
                f.write_all(&chunk[..n])?;
            }
            left -= n;
        }
        report.bytes += got as u64;
        report.responses += 1;
        report.batches += planned.batch_count() as u64;
        correlation = correlation.wrapping_add(1).max(0);
    }
    report.elapsed = start.elapsed();
    Ok(report)
}
