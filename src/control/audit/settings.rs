//! A mirror's `mirror.audit.*` properties: on by default, how often a round runs and how many
//! bytes a second it may read locally and fetch again from the source.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::control::mirror_def::{parse_bool, parse_u64_in, properties_under, DefinitionError};
use crate::limits::{
    AUDIT_BYTES_PER_SEC_DEFAULT, AUDIT_INTERVAL_MS_DEFAULT, AUDIT_INTERVAL_MS_MAX,
    AUDIT_INTERVAL_MS_MIN, AUDIT_ROUND_BYTES_MAX,
};

/// Every key this module owns starts with this; `MirrorDefinition` leaves them to it.
pub const PREFIX: &str = "mirror.audit.";

const ENABLED: &str = "mirror.audit.enabled";
const INTERVAL: &str = "mirror.audit.interval.ms";
const BYTES_PER_SEC: &str = "mirror.audit.bytes.per.sec";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditSettings {
    pub enabled: bool,
    pub interval_ms: u64,
    /// Bytes a second, summed over local re-reads and source fetches.
    pub bytes_per_sec: u64,
}

impl Default for AuditSettings {
    fn default() -> Self {
        AuditSettings {
            enabled: true,
            interval_ms: AUDIT_INTERVAL_MS_DEFAULT,
            bytes_per_sec: AUDIT_BYTES_PER_SEC_DEFAULT,
        }
    }
}

impl AuditSettings {
    pub fn from_properties(props: &BTreeMap<String, String>) -> Result<Self, DefinitionError> {
        let mut s = AuditSettings::default();
        for (key, v) in properties_under(props, PREFIX) {
            match key.as_str() {
                ENABLED => s.enabled = parse_bool(key, v)?,
                INTERVAL => {
                    s.interval_ms = parse_u64_in(
                        key,
                        v,
                        AUDIT_INTERVAL_MS_MIN..=AUDIT_INTERVAL_MS_MAX,
                        "interval in ms (100 ms to 24 h)",
                    )?
                }
                BYTES_PER_SEC => {
                    s.bytes_per_sec =
                        parse_u64_in(key, v, 1..=u64::MAX, "bytes per second (at least 1)")?
                }
                _ => return Err(DefinitionError::UnknownProperty(key.clone())),
            }
        }
        Ok(s)
    }

    /// Bytes one round may read: the rate over the interval, at most `AUDIT_ROUND_BYTES_MAX`.
    /// A round always handles at least one batch per partition, so a tiny budget still moves.
    pub fn round_budget(&self) -> u64 {
        let b = u128::from(self.bytes_per_sec) * u128::from(self.interval_ms) / 1000;
        (b.min(u128::from(AUDIT_ROUND_BYTES_MAX)) as u64).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(text: &str) -> BTreeMap<String, String> {
        crate::control::mirror_def::parse_properties(text).unwrap()
    }

    #[test]
    fn defaults_values_and_errors() {
        let s = AuditSettings::from_properties(&props("bootstrap.servers=a:1\n")).unwrap();
        assert_eq!(s, AuditSettings::default());
        assert!(s.enabled);
        let s = AuditSettings::from_properties(&props(
            "mirror.audit.enabled=FALSE\nmirror.audit.interval.ms=500\nmirror.audit.bytes.per.sec=1000\n",
        ))
        .unwrap();
        assert!(!s.enabled);
        assert_eq!((s.interval_ms, s.bytes_per_sec), (500, 1000));
        assert_eq!(s.round_budget(), 500);
        for bad in [
            "mirror.audit.enabled=yes\n",
            "mirror.audit.interval.ms=5\n",
            "mirror.audit.bytes.per.sec=0\n",
            "mirror.audit.speed=3\n",
        ] {
            let e = AuditSettings::from_properties(&props(bad)).unwrap_err();
            assert!(e.to_string().contains("mirror.audit."), "{bad}: {e}");
        }
        let huge = AuditSettings {
            bytes_per_sec: u64::MAX,
            ..AuditSettings::default()
        };
        assert_eq!(huge.round_budget(), AUDIT_ROUND_BYTES_MAX);
    }
}
