//! Planted defects for `make dst-mutants`: the deterministic simulation (dst/) must catch each
//! one. Only the `dst-mutants` feature compiles them in; production builds never enable it, and
//! without it [`active`] is a constant `false` the compiler removes with the hook.
//! `ENI_DST_MUTANT=<name>` selects the defect of a run.

/// Every planted defect, by name.
pub const ALL: [&str; 21] = [
    "release-used",
    "drain-is-gone",
    "reuse-burned-token",
    "write-every-pass",
    "touch-foreign-eni",
    "unassign-before-withdraw",
    "release-running-instance",
    "trust-lagging-describe",
    "no-fence",
    "static-ip-race-won",
    "delete-on-watch",
    "limits-not-awaited",
    "keep-write-answer",
    "serve-without-node",
    "release-named-instance",
    "serve-cilium-known-node",
    "trust-forged-finalizer",
    "trust-named-instance",
    "manage-refused-instance",
    "static-ip-any-tag",
    "growth-only-by-successes",
];

/// Whether the defects are compiled into this build.
pub const COMPILED: bool = cfg!(feature = "dst-mutants");

/// Whether the defect `name` is active in this run.
#[cfg(feature = "dst-mutants")]
pub fn active(name: &str) -> bool {
    static SELECTED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    SELECTED
        .get_or_init(|| std::env::var("ENI_DST_MUTANT").ok())
        .as_deref()
        == Some(name)
}

#[cfg(not(feature = "dst-mutants"))]
#[inline(always)]
pub const fn active(_name: &str) -> bool {
    false
}
