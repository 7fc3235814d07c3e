//! Where the Kafka jars and the JVM live.

use std::path::PathBuf;

/// The folder holding the jars of Kafka `version`, as `tests/kafka/fetch-jars.sh` leaves it.
///
/// Missing jars fail the test: a harness that skips when Kafka is absent would let CI pass
/// without ever talking to Kafka.
pub fn kafka_libs(version: &str) -> PathBuf {
    let dir = match std::env::var_os("KMIRROR_KAFKA_LIBS") {
        Some(d) if version == super::KafkaVersion::DEFAULT.name() => PathBuf::from(d),
        _ => cache_root().join(format!("kafka-{version}")).join("libs"),
    };
    if !dir.join(".complete").exists() {
        panic!(
            "Kafka {version} jars are missing in {}: run `bash tests/kafka/fetch-jars.sh`",
            dir.display()
        );
    }
    dir
}

/// `~/.cache/kmirror`, where fetched jars and the compiled test tool are kept between runs.
pub fn cache_root() -> PathBuf {
    let home = std::env::var_os("HOME").expect("HOME is not set");
    PathBuf::from(home).join(".cache").join("kmirror")
}

/// The classpath argument for every jar of `version`.
pub fn classpath(version: &str) -> String {
    format!("{}/*", kafka_libs(version).display())
}

/// The `java` launcher: `$JAVA_HOME/bin/java` when set, else `java` from PATH.
pub fn java() -> PathBuf {
    match std::env::var_os("JAVA_HOME") {
        Some(home) => PathBuf::from(home).join("bin").join("java"),
        None => PathBuf::from("java"),
    }
}

/// `javac` next to [`java`].
pub fn javac() -> PathBuf {
    match std::env::var_os("JAVA_HOME") {
        Some(home) => PathBuf::from(home).join("bin").join("javac"),
        None => PathBuf::from("javac"),
    }
}

/// JVM flags for short-lived tools: small heap, fast start, quiet logging to stderr.
pub fn tool_jvm_flags() -> Vec<String> {
    let mut flags: Vec<String> = [
        "-Xmx256m",
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        "-Xshare:auto",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    flags.extend(quiet_logging_flags());
    flags
}

/// Log4j settings that send only warnings to stderr. Kafka 4 logs through slf4j → reload4j here,
/// and its code also touches log4j2, so both get a configuration (otherwise each prints a
/// "no configuration" complaint).
pub fn quiet_logging_flags() -> Vec<String> {
    let dir = cache_root().join("harness");
    let log4j1 = write_if_changed(
        &dir,
        "log4j-quiet.properties",
        "log4j.rootLogger=WARN, stderr\n\
         log4j.appender.stderr=org.apache.log4j.ConsoleAppender\n\
         log4j.appender.stderr.Target=System.err\n\
         log4j.appender.stderr.layout=org.apache.log4j.PatternLayout\n\
         log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n\n",
    );
    let log4j2 = write_if_changed(
        &dir,
        "log4j2-quiet.properties",
        "status=error\nrootLogger.level=warn\n",
    );
    vec![
        format!("-Dlog4j.configuration=file:{}", log4j1.display()),
        format!("-Dlog4j2.configurationFile={}", log4j2.display()),
    ]
}

/// Writes `name` in `dir` unless it already holds `content`; written via rename so concurrent
/// test processes never read half a file.
pub fn write_if_changed(dir: &std::path::Path, name: &str, content: &str) -> PathBuf {
    let path = dir.join(name);
    if std::fs::read_to_string(&path).ok().as_deref() == Some(content) {
        return path;
    }
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    std::fs::write(&tmp, content).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, &path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
    path
}
