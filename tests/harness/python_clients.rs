//! The Python stock clients of the tests, run from the project virtualenv (`tests/setup.sh`):
//! kafka-python (`tests/python/kafka_python_client.py`) and librdkafka through confluent-kafka
//! (`tests/python/librdkafka_client.py`). Each prints one JSON object per line.

use std::path::Path;
use std::process::Command;

use super::tool::ConsumedRecord;

/// Runs `tests/python/<script>` with `args` and parses its lines; the test fails (never
/// skips) when the script fails, e.g. because its client is not installed.
pub fn run_python(script: &str, args: &[&str]) -> Vec<serde_json::Value> {
    run_python_with(script, args, None)
}

/// `run_python` with `client_config` (a JSON object of client settings, e.g. SASL) given to
/// every client the script makes (`$KMIRROR_CLIENT_CONFIG`).
pub fn run_python_with(
    script: &str,
    args: &[&str],
    client_config: Option<&serde_json::Value>,
) -> Vec<serde_json::Value> {
    let out = python_command(script, args, client_config)
        .output()
        .expect("run the virtualenv Python");
    assert!(
        out.status.success(),
        "{script} {args:?} failed (tests/setup.sh installs the clients into .venv):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// The command that runs `tests/python/<script>` with `args` and `client_config`, for tests
/// that expect it to fail.
pub fn python_command(
    script: &str,
    args: &[&str],
    client_config: Option<&serde_json::Value>,
) -> Command {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let mut cmd = Command::new(super::python());
    cmd.arg(&path).args(args);
    if let Some(c) = client_config {
        cmd.env("KMIRROR_CLIENT_CONFIG", c.to_string());
    }
    cmd
}

/// Runs `tests/python/<script>` expecting it to fail (a refused login); returns what it
/// printed, stdout then stderr. Panics if it succeeded.
pub fn run_python_refused(
    script: &str,
    args: &[&str],
    client_config: Option<&serde_json::Value>,
) -> String {
    let out = python_command(script, args, client_config)
        .output()
        .expect("run the virtualenv Python");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "{script} {args:?} succeeded:\n{said}"
    );
    said
}

/// kafka-python (`kafka_python_client.py`).
pub fn kafka_python(args: &[&str]) -> Vec<serde_json::Value> {
    run_python("kafka_python_client.py", args)
}

/// librdkafka through confluent-kafka (`librdkafka_client.py`).
pub fn librdkafka(args: &[&str]) -> Vec<serde_json::Value> {
    run_python("librdkafka_client.py", args)
}

/// Records printed by either script's `consume` (key, value and header values in base64).
pub fn records(lines: &[serde_json::Value]) -> Vec<ConsumedRecord> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let bytes = |v: &serde_json::Value| v.as_str().map(|s| b64.decode(s).unwrap());
    lines
        .iter()
        .map(|l| ConsumedRecord {
            offset: l["offset"].as_i64().unwrap(),
            timestamp: l["timestamp"].as_i64().unwrap(),
            key: bytes(&l["key"]),
            value: bytes(&l["value"]),
            headers: l["headers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| (h[0].as_str().unwrap().to_string(), bytes(&h[1]).unwrap()))
                .collect(),
        })
        .collect()
}
