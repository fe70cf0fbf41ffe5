//! The grammars of flag values: Go durations, `key=value` tags, gate bucket overrides.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::ec2::Bucket;

/// Parse a duration in Go's `time.ParseDuration` grammar (`500ms`, `1.5m`, `1h30m`, `0`), as
/// Cilium's flags and Helm values take them, so a value pasted from a Cilium install means the
/// same here. The chart's `values.schema.json` pattern accepts the same strings
/// (`tests/chart.rs` runs both over one table). Negative durations are refused.
pub fn parse_duration(input: &str) -> Result<Duration, String> {
    // Go's one unit-less form (signed too), which the crate does not take.
    let parsed = if input.strip_prefix(['+', '-']).unwrap_or(input) == "0" {
        Ok(go_duration::GoDuration::ZERO)
    } else {
        go_duration::parse_go_duration(input)
    };
    let nanos = parsed
        .map_err(|e| {
            format!("invalid duration {input:?}: {e} (Go's syntax: 500ms, 15s, 1.5m, 1h30m)")
        })?
        .nanoseconds();
    if input.starts_with('-') {
        return Err(format!("invalid duration {input:?}: must not be negative"));
    }
    Ok(Duration::from_nanos(nanos.unsigned_abs()))
}

/// One `key=value` tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tag {
    pub key: String,
    pub value: String,
}

impl Tag {
    pub(super) fn map(tags: &[Tag]) -> BTreeMap<String, String> {
        tags.iter()
            .map(|t| (t.key.clone(), t.value.clone()))
            .collect()
    }
}

impl FromStr for Tag {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok(Tag {
                key: k.trim().to_string(),
                value: v.trim().to_string(),
            }),
            _ => Err(format!("invalid tag {s:?}: expected key=value")),
        }
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

/// `NAME=BURST/RATE`: replaces one gate bucket's limits (not scaled by the rate fraction); the
/// name of a bucket group of earlier versions (`describe`, `general-mutating`) sets each of its
/// buckets.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketOverride {
    pub buckets: Vec<Bucket>,
    pub burst: u32,
    /// Tokens per second.
    pub rate: f64,
}

impl FromStr for BucketOverride {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "invalid bucket override {s:?}: expected NAME=BURST/RATE, e.g. describe-instances=100/20"
            )
        };
        let (name, limits) = s.split_once('=').ok_or_else(bad)?;
        let name = name.trim();
        let buckets = Bucket::named(name).ok_or_else(|| {
            format!(
                "unknown EC2 bucket {name:?}; known: {}",
                Bucket::known_names().join(", ")
            )
        })?;
        let (burst, rate) = limits.split_once('/').ok_or_else(bad)?;
        let burst: u32 = burst.trim().parse().map_err(|_| bad())?;
        let rate: f64 = rate.trim().parse().map_err(|_| bad())?;
        if burst == 0 || !(rate > 0.0 && rate.is_finite()) {
            return Err(format!(
                "invalid bucket override {s:?}: burst and rate must be positive"
            ));
        }
        Ok(BucketOverride {
            buckets,
            burst,
            rate,
        })
    }
}
