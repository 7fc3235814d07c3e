//! Reads the operator files under `ops/` (Prometheus alert rules, Grafana dashboard) for the
//! tests: every PromQL expression they hold, the metric names those expressions select, and
//! the sample names a `/metrics` exposition offers, so a test can check that every query names
//! a metric kmirror exports.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub fn ops_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ops")
}

pub const ALERT_RULES: &str = "prometheus/kmirror-alerts.yml";
pub const ALERT_TESTS: &str = "prometheus/kmirror-alerts.test.yml";
pub const DASHBOARD: &str = "grafana/kmirror-dashboard.json";

/// Series Prometheus makes itself for every scrape target, not kmirror's.
pub const PROMETHEUS_SERIES: [&str; 1] = ["up"];

/// The `expr:` of every rule in a rules file. The file keeps each expression on its `expr:`
/// line (the test compares the count with promtool's, so a rule written otherwise is noticed).
pub fn rule_exprs(yaml: &str) -> Vec<String> {
    yaml.lines()
        .filter_map(|l| l.trim_start().strip_prefix("expr:"))
        .map(|e| {
            let e = e.trim();
            assert!(
                !e.is_empty() && !e.starts_with(['|', '>']),
                "keep each rule's expr on its line: {e:?}"
            );
            e.to_owned()
        })
        .collect()
}

/// Every PromQL query of a Grafana dashboard: the `expr` of each panel target (rows' nested
/// panels too) and the metric selector inside each query variable's `label_values(...)`.
pub fn dashboard_exprs(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    fn panels(v: &serde_json::Value, out: &mut Vec<String>) {
        for p in v.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("target without expr in {}", p["title"]));
                out.push(expr.to_owned());
            }
            panels(&p["panels"], out);
        }
    }
    panels(&dashboard["panels"], &mut out);
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if var["type"] != "query" {
            continue;
        }
        let q = var["query"]["query"]
            .as_str()
            .or(var["query"].as_str())
            .unwrap_or_else(|| panic!("query variable without a query: {var}"));
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.rsplit_once(','))
            .map(|(selector, _label)| selector)
            .unwrap_or_else(|| panic!("variable query is not label_values(selector, label): {q}"));
        out.push(inner.to_owned());
    }
    out
}

/// Words of PromQL that are followed by a list of label names.
const LABEL_LIST_MODIFIERS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Other words of PromQL that are not metric names when they stand alone (aggregation
/// operators may be followed by `by (...)` instead of their parenthesis).
const KEYWORDS: [&str; 23] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "atan2",
    "start",
];

/// The metric names a PromQL expression selects: identifiers that are not functions (followed
/// by `(`), keywords, label names inside `{...}` or in `by (...)`/`on (...)` lists, durations
/// in `[...]`, numbers, strings or Grafana `$variables`.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let b = expr.as_bytes();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut skip_list_after = false;
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' | b'\'' | b'`' => {
                i += 1;
                while i < b.len() && b[i] != c {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'{' | b'[' => {
                let close = if c == b'{' { b'}' } else { b']' };
                while i < b.len() && b[i] != close {
                    if b[i] == b'"' {
                        i += 1;
                        while i < b.len() && b[i] != b'"' {
                            i += if b[i] == b'\\' { 2 } else { 1 };
                        }
                    }
                    i += 1;
                }
                i += 1;
            }
            b'(' if skip_list_after => {
                // A label list: by (mirror, topic), on (job), group_left (x).
                while i < b.len() && b[i] != b')' {
                    i += 1;
                }
                i += 1;
                skip_list_after = false;
            }
            b'$' => {
                i += 1;
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
            }
            c if c.is_ascii_digit() || c == b'.' => {
                // Numbers, also 1e9 and 0x1f: consume the whole token.
                while i < b.len() && (ident(b[i]) || b[i] == b'.') {
                    i += 1;
                }
            }
            c if ident(c) => {
                let start = i;
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
                let word = &expr[start..i];
                let mut j = i;
                while j < b.len() && b[j].is_ascii_whitespace() {
                    j += 1;
                }
                let lower = word.to_ascii_lowercase();
                if LABEL_LIST_MODIFIERS.contains(&lower.as_str()) {
                    skip_list_after = true;
                } else if j < b.len() && b[j] == b'(' {
                    // A function call.
                } else if !KEYWORDS.contains(&lower.as_str()) {
                    names.insert(word.to_owned());
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// The sample names an exposition offers: every sample line's name, and for every `# TYPE`
/// family the names its samples have (counter `_total`, histogram `_bucket`/`_sum`/`_count`,
/// summary `_sum`/`_count` and the name itself), so a family with no sample yet still counts.
pub fn exported_names(exposition: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (Some(name), Some(kind)) = (it.next(), it.next()) else {
                panic!("bad TYPE line {line:?}");
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["", "_sum", "_count"],
                _ => &[""],
            };
            for s in suffixes {
                // A counter's TYPE line may already carry `_total` (older encoders).
                let full = if name.ends_with(s) {
                    name.to_owned()
                } else {
                    format!("{name}{s}")
                };
                out.insert(full);
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            out.insert(line[..end].to_owned());
        }
    }
    out
}

#[test]
fn metric_names_skip_functions_labels_and_variables() {
    let e = r#"histogram_quantile(0.99, sum by (le) (rate(kmirror_shard_append_seconds_bucket{job=~"$job"}[$__rate_interval])))"#;
    assert_eq!(
        metric_names(e).into_iter().collect::<Vec<_>>(),
        ["kmirror_shard_append_seconds_bucket"]
    );
    let e = r#"kmirror_partition_lag_offsets > 0 and on (mirror) increase(kmirror_partition_mirrored_bytes_total[10m]) == 0"#;
    assert_eq!(
        metric_names(e).into_iter().collect::<Vec<_>>(),
        [
            "kmirror_partition_lag_offsets",
            "kmirror_partition_mirrored_bytes_total"
        ]
    );
    let e = r#"predict_linear(free_bytes[6h], 24 * 3600) < 0 or up{job="a b"} == 1e3 unless max without (x) (m) > bool 2"#;
    assert_eq!(
        metric_names(e).into_iter().collect::<Vec<_>>(),
        ["free_bytes", "m", "up"]
    );
}

#[test]
fn exported_names_follow_each_family_type() {
    let text = "# TYPE a counter\na_total 1\n# TYPE h histogram\n# TYPE g gauge\ng{x=\"1\"} 2\n";
    let names = exported_names(text);
    for n in ["a_total", "h_bucket", "h_sum", "h_count", "g"] {
        assert!(names.contains(n), "{n} in {names:?}");
    }
    assert!(!names.contains("h"), "a histogram has no bare series");
    assert!(!names.contains("a"), "a counter's samples end in _total");
}
