//! Which Cilium release runs, as far as the handover guard can tell, and whether it honours
//! `ipam.cilium.io/ignore` (pure). The signal is the `io.cilium.k8s.crd.schema.version` label
//! Cilium's operator writes on the CRDs it registers (`pkg/k8s/apis/cilium.io/register.go`,
//! `CustomResourceDefinitionSchemaVersion`; `pkg/k8s/apis/crdhelpers/register.go` rewrites a CRD
//! only when its label is older or missing, so the label is the newest schema any Cilium operator
//! registered: after a downgrade it still names the newer one, see
//! `docs/migrating-from-cilium.md`).
//!
//! Where the numbers come from (Cilium's public history): each "Prepare for v1.N development
//! cycle" commit sets the schema to 1.(N+13).0 (1.30.0 for v1.17, 1.31.0 for v1.18, 1.32.0 for
//! v1.19); on our test world (e2e `cilium-handover`) the 1.16.0-dev binary wrote 1.29.4 and the
//! 1.20.0-dev one 1.33.9. The annotation came with commit fd768ac4 "ipam: skip CiliumNodes
//! marked with appropriate annotation" (`operator/cmd/cilium_node.go`, `pkg/annotation/k8s.go`
//! `IPAMIgnore`), merged on 2025-02-26 into the v1.18 development cycle, between the schema bumps
//! to 1.31.2 (deae87a4) and 1.31.3 (f07d111b): first release v1.18.0.

use std::fmt;

use crate::crd::CILIUM_IGNORE_ANNOTATION;

/// The label that carries the schema version.
pub const SCHEMA_LABEL: &str = "io.cilium.k8s.crd.schema.version";
/// The CRD whose label is read (the one this operator serves).
pub const CILIUM_NODE_CRD: &str = "ciliumnodes.cilium.io";
/// The first schema version only trees with the annotation write (see the module doc).
pub const FIRST_HONOURING: Schema = Schema(1, 31, 3);
/// The first Cilium release that honours the annotation.
pub const FIRST_HONOURING_RELEASE: &str = "1.18";

/// A CRD schema version, `major.minor.patch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Schema(pub u32, pub u32, pub u32);

impl Schema {
    /// `1.29.4` (a leading `v` and a missing patch are accepted); `None` if not a version.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().trim_start_matches('v');
        let mut parts = s.split('.').map(str::parse::<u32>);
        let major = parts.next()?.ok()?;
        let minor = parts.next()?.ok()?;
        let patch = parts.next().unwrap_or(Ok(0)).ok()?;
        parts.next().is_none().then_some(Self(major, minor, patch))
    }

    /// The Cilium release line that writes it: schema 1.(N+13).x is Cilium 1.N, from 1.16 on.
    pub fn release(self) -> String {
        match self {
            Self(1, minor, _) if minor >= 29 => format!("1.{}", minor - 13),
            _ => "older than 1.16".into(),
        }
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// What the guard knows about the Cilium operator's release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CiliumVersion {
    /// Taken as honouring the annotation: the user said so (`--cilium-honours-ignore`), or no
    /// reader runs (a core built without one, as in tests).
    Vouched,
    /// The label read from [`CILIUM_NODE_CRD`].
    Schema(Schema),
    /// Not read yet, the CRD cannot be read, or it carries no usable label: why.
    Unknown(String),
}

impl CiliumVersion {
    /// From the CRD's label (`None`: the CRD has no such label).
    pub fn from_label(label: Option<&str>) -> Self {
        match label {
            None => Self::Unknown(format!("{CILIUM_NODE_CRD} has no {SCHEMA_LABEL} label")),
            Some(l) => Schema::parse(l).map_or_else(
                || Self::Unknown(format!("{SCHEMA_LABEL}={l:?} on {CILIUM_NODE_CRD}")),
                Self::Schema,
            ),
        }
    }

    /// Why Cilium's operator cannot be relied on to keep off a node with the annotation;
    /// `None` when it can. Fails closed: a version that cannot be told is not relied on.
    pub fn ignore_unsupported(&self) -> Option<String> {
        let upgrade = format!(
            "upgrade Cilium to {FIRST_HONOURING_RELEASE} or later before handing over, or stop \
             its operator (scale deploy/cilium-operator to 0 in Cilium's namespace)"
        );
        match self {
            Self::Vouched => None,
            Self::Schema(s) if *s >= FIRST_HONOURING => None,
            Self::Schema(s) => Some(format!(
                "Cilium operator {} (CRD schema {s} on {CILIUM_NODE_CRD}) ignores \
                 {CILIUM_IGNORE_ANNOTATION}: {upgrade}",
                s.release()
            )),
            Self::Unknown(why) => Some(format!(
                "Cilium operator's release cannot be told ({why}), and before \
                 {FIRST_HONOURING_RELEASE} it ignores {CILIUM_IGNORE_ANNOTATION}: {upgrade}, or \
                 pass --cilium-honours-ignore if you verified it is {FIRST_HONOURING_RELEASE} or \
                 later"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_versions_parse_and_order() {
        assert_eq!(Schema::parse("1.29.4"), Some(Schema(1, 29, 4)));
        assert_eq!(Schema::parse("v1.31"), Some(Schema(1, 31, 0)));
        assert_eq!(Schema::parse("1.31.2.1"), None);
        assert_eq!(Schema::parse("totally-not-semver"), None);
        assert!(Schema(1, 31, 2) < FIRST_HONOURING && FIRST_HONOURING < Schema(1, 32, 0));
        assert!(Schema(1, 30, 9) < Schema(1, 31, 0));
    }

    #[test]
    fn the_schema_names_the_release_line() {
        assert_eq!(Schema(1, 29, 4).release(), "1.16");
        assert_eq!(Schema(1, 31, 10).release(), "1.18");
        assert_eq!(Schema(1, 33, 0).release(), "1.20");
        assert_eq!(Schema(1, 26, 0).release(), "older than 1.16");
    }

    #[test]
    fn only_a_release_with_the_annotation_or_a_vouched_one_is_relied_on() {
        let v116 = CiliumVersion::from_label(Some("1.29.4"));
        let why = v116.ignore_unsupported().expect("1.16 ignores it");
        assert!(
            why.starts_with("Cilium operator 1.16 (CRD schema 1.29.4"),
            "{why}"
        );
        assert!(why.contains("upgrade Cilium to 1.18 or later"), "{why}");
        // 1.18.0-dev builds before the annotation landed wrote 1.31.0 to 1.31.2.
        assert!(
            CiliumVersion::from_label(Some("1.31.2"))
                .ignore_unsupported()
                .is_some()
        );
        assert_eq!(
            CiliumVersion::from_label(Some("1.31.3")).ignore_unsupported(),
            None
        );
        assert_eq!(
            CiliumVersion::from_label(Some("1.33.1")).ignore_unsupported(),
            None
        );
        assert_eq!(CiliumVersion::Vouched.ignore_unsupported(), None);
        for unknown in [
            CiliumVersion::from_label(None),
            CiliumVersion::from_label(Some("x")),
        ] {
            let why = unknown.ignore_unsupported().expect("fails closed");
            assert!(why.contains("--cilium-honours-ignore"), "{why}");
        }
    }
}
