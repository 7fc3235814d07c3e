//! `kmirror latency FILE`: reads an HdrHistogram interval log written by the telemetry thread
//! (or any standard interval log), merges the intervals per latency (tags `<latency>.shard<N>`
//! are merged over shards; untagged entries count as `untagged`), and prints a percentile table;
//! `--plot` draws the percentile distribution (`latency_plot`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
use hdrhistogram::serialization::Deserializer;
use hdrhistogram::Histogram;

use crate::limits::{LATENCY_MAX_NS, LATENCY_SIGNIFICANT_DIGITS};

/// Why a latency log could not be read or plotted.
#[derive(Debug, thiserror::Error)]
pub enum LatencyError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not an interval log (parse error at byte {offset})")]
    Parse { path: PathBuf, offset: usize },
    #[error("{path}: entry {entry}: bad histogram encoding: {why}")]
    Histogram {
        path: PathBuf,
        entry: usize,
        why: String,
    },
    #[error("{path}: no interval histograms")]
    Empty { path: PathBuf },
    #[error("plot {path}: {why}")]
    Plot { path: PathBuf, why: String },
    #[error("writing the table: {0}")]
    Output(#[from] std::io::Error),
}

/// The merged histograms of one log, by latency name.
pub type Merged = BTreeMap<String, Histogram<u64>>;

fn latency_name(tag: Option<&str>) -> String {
    match tag {
        Some(t) => t.split(".shard").next().unwrap_or(t).to_owned(),
        None => "untagged".to_owned(),
    }
}

/// Reads one interval log and merges its intervals per latency.
pub fn read_file(path: &Path) -> Result<Merged, LatencyError> {
    let bytes = std::fs::read(path).map_err(|source| LatencyError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut merged = Merged::new();
    let mut de = Deserializer::new();
    for (entry, item) in IntervalLogIterator::new(&bytes).enumerate() {
        let e = item.map_err(|e| match e {
            hdrhistogram::serialization::interval_log::LogIteratorError::ParseError { offset } => {
                LatencyError::Parse {
                    path: path.to_owned(),
                    offset,
                }
            }
        })?;
        let LogEntry::Interval(ih) = e else { continue };
        let bad = |why: String| LatencyError::Histogram {
            path: path.to_owned(),
            entry,
            why,
        };
        let raw = base64::engine::general_purpose::STANDARD
            .decode(ih.encoded_histogram())
            .map_err(|e| bad(e.to_string()))?;
        let h: Histogram<u64> = de
            .deserialize(&mut raw.as_slice())
            .map_err(|e| bad(format!("{e:?}")))?;
        let name = latency_name(ih.tag().map(|t| t.as_str()));
        let into = merged.entry(name).or_insert_with(|| {
            let mut h = Histogram::new_with_bounds(1, LATENCY_MAX_NS, LATENCY_SIGNIFICANT_DIGITS)
                .expect("bounds from limits.rs are valid");
            h.auto(true);
            h
        });
        into.add(&h).map_err(|e| bad(format!("{e:?}")))?;
    }
    if merged.is_empty() {
        return Err(LatencyError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(merged)
}

/// Sample counts per latency over every `.hlog` file in `dir` (for tests and quick checks).
pub fn read_dir_totals(dir: &Path) -> Result<BTreeMap<String, u64>, LatencyError> {
    let entries = std::fs::read_dir(dir).map_err(|source| LatencyError::Read {
        path: dir.to_owned(),
        source,
    })?;
    let mut totals = BTreeMap::new();
    for e in entries {
        let p = e
            .map_err(|source| LatencyError::Read {
                path: dir.to_owned(),
                source,
            })?
            .path();
        if p.extension().is_none_or(|x| x != "hlog") {
            continue;
        }
        match read_file(&p) {
            Ok(m) => {
                for (name, h) in m {
                    *totals.entry(name).or_insert(0) += h.len();
                }
            }
            Err(LatencyError::Empty { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(totals)
}

/// Percentiles printed in the table.
pub const PERCENTILES: [f64; 7] = [50.0, 90.0, 99.0, 99.9, 99.99, 99.999, 100.0];

/// Prints one row per latency: count, then each percentile in milliseconds.
pub fn print_table(merged: &Merged, out: &mut impl Write) -> Result<(), LatencyError> {
    write!(out, "{:<18} {:>10}", "latency (ms)", "count")?;
    for p in &PERCENTILES {
        let label = if *p == 100.0 {
            "max".to_owned()
        } else {
            format!("p{p}")
        };
        write!(out, " {label:>10}")?;
    }
    writeln!(out, " {:>10}", "mean")?;
    for (name, h) in merged {
        write!(out, "{name:<18} {:>10}", h.len())?;
        for p in &PERCENTILES {
            write!(
                out,
                " {:>10.3}",
                h.value_at_quantile(p / 100.0) as f64 / 1e6
            )?;
        }
        writeln!(out, " {:>10.3}", h.mean() / 1e6)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
    use hdrhistogram::serialization::V2DeflateSerializer;
    use std::time::Duration;

    #[test]
    fn merges_shards_per_latency_and_rejects_garbage() {
        let mut buf = Vec::new();
        let mut ser = V2DeflateSerializer::new();
        {
            let mut w = IntervalLogWriterBuilder::new()
                .begin_log_with(&mut buf, &mut ser)
                .unwrap();
            for (tag, values) in [
                ("append.shard0", &[1_000u64, 2_000][..]),
                ("append.shard1", &[3_000][..]),
                ("end_to_end.shard0", &[5_000_000][..]),
            ] {
                let mut h = Histogram::<u64>::new(3).unwrap();
                for v in values {
                    h.record(*v).unwrap();
                }
                w.write_histogram(&h, Duration::ZERO, Duration::from_secs(1), Tag::new(tag))
                    .unwrap();
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.hlog");
        std::fs::write(&path, &buf).unwrap();
        let m = read_file(&path).unwrap();
        assert_eq!(m["append"].len(), 3);
        assert_eq!(m["end_to_end"].len(), 1);
        let mut table = Vec::new();
        print_table(&m, &mut table).unwrap();
        let table = String::from_utf8(table).unwrap();
        assert!(table
            .lines()
            .any(|l| l.starts_with("append") && l.contains(" 3 ")));
        let totals = read_dir_totals(dir.path()).unwrap();
        assert_eq!(totals["append"], 3);

        std::fs::write(&path, b"Tag=x,1.0,1.0,1.0,!!notbase64!!\n").unwrap();
        assert!(matches!(
            read_file(&path),
            Err(LatencyError::Histogram { .. } | LatencyError::Parse { .. })
        ));
    }
}
