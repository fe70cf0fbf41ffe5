//! The Prometheus registry (prefix `eni_operator`) shared by every component, and its encoding.
//!
//! Components own their metric families and register them once at start-up. The pattern:
//!
//! ```
//! use prometheus_client::metrics::{counter::Counter, family::Family};
//! use eni_operator::metrics::MetricsRegistry;
//!
//! type Labels = Vec<(String, String)>;
//!
//! #[derive(Clone, Default)]
//! struct GcMetrics {
//!     deleted: Family<Labels, Counter>,
//! }
//!
//! impl GcMetrics {
//!     fn register(registry: &MetricsRegistry) -> Self {
//!         let m = Self::default();
//!         // Exposed as `eni_operator_gc_enis_deleted_total{reason="..."}`.
//!         registry.register("gc_enis_deleted", "ENIs deleted by the GC", m.deleted.clone());
//!         m
//!     }
//! }
//!
//! let registry = MetricsRegistry::new();
//! let gc = GcMetrics::register(&registry);
//! gc.deleted.get_or_create(&vec![("reason".into(), "leaked".into())]).inc();
//! assert!(registry.encode().contains("eni_operator_gc_enis_deleted_total{reason=\"leaked\"} 1"));
//! ```

use std::sync::{Arc, RwLock};

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry};

use crate::metrics_compat::MetricsCompat;

pub const PREFIX: &str = "eni_operator";

/// A cheaply cloneable handle on the one registry; registration may happen after the HTTP
/// server has started (the runtime registers its families when it becomes leader).
#[derive(Clone)]
pub struct MetricsRegistry {
    inner: Arc<RwLock<Registry>>,
    /// Families under their own standard names, without the prefix (`process_*`).
    unprefixed: Arc<RwLock<Registry>>,
    /// JSON pages served at `/debug/<name>` on the metrics listener (e.g. `shadow`).
    debug: Arc<RwLock<DebugPages>>,
    /// `--metrics-compat`.
    compat: MetricsCompat,
}

type DebugPage = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;
type DebugPages = std::collections::BTreeMap<String, DebugPage>;

impl Default for MetricsRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricsRegistry {
    /// A registry with `eni_operator_build_info{version="..."} 1` already in it.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        registry.register(
            "build",
            "eni-operator build information",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let mut unprefixed = Registry::default();
        unprefixed
            .sub_registry_with_prefix("process")
            .register_collector(Box::new(crate::process_metrics::ProcessCollector));
        Self {
            inner: Arc::new(RwLock::new(registry)),
            unprefixed: Arc::new(RwLock::new(unprefixed)),
            debug: Arc::default(),
            compat: MetricsCompat::None,
        }
    }

    /// Serve `--metrics-compat`'s extra names too ([`crate::metrics_compat`]).
    pub fn with_compat(mut self, compat: MetricsCompat) -> Self {
        self.compat = compat;
        self
    }

    /// What `/metrics` answers: content type and body (OpenMetrics; Prometheus text 0.0.4
    /// with Cilium's families under `--metrics-compat=cilium`).
    pub fn scrape(&self) -> (&'static str, String) {
        match self.compat {
            MetricsCompat::None => (CONTENT_TYPE, self.encode()),
            MetricsCompat::Cilium => (
                crate::metrics_compat::TEXT_CONTENT_TYPE,
                crate::metrics_compat::compat_text(&self.encode()),
            ),
        }
    }

    /// Serve `page()` as JSON at `/debug/<name>` (registered by a component once it runs).
    pub fn set_debug_page(
        &self,
        name: &str,
        page: impl Fn() -> serde_json::Value + Send + Sync + 'static,
    ) {
        let mut pages = self.debug.write().unwrap_or_else(|e| e.into_inner());
        pages.insert(name.to_string(), Arc::new(page));
    }

    /// The JSON of `/debug/<name>`, if such a page is registered.
    pub fn debug_page(&self, name: &str) -> Option<serde_json::Value> {
        let page = self
            .debug
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()?;
        Some(page())
    }

    /// Register one metric or family under `eni_operator_<name>`.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.with(|r| r.register(name, help, metric));
    }

    /// Full access, e.g. for `sub_registry_with_prefix` or `register_with_unit`.
    pub fn with<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        // A panic while registering leaves the registry usable: keep serving metrics.
        let mut guard = self.inner.write().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    /// The OpenMetrics text exposition of everything registered.
    pub fn encode(&self) -> String {
        let guard = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let plain = self.unprefixed.read().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        // Writing into a String cannot fail; an encoder error would be a bug in a metric.
        let encoded = encode_registry(&mut out, &guard)
            .and_then(|()| encode_registry(&mut out, &plain))
            .and_then(|()| encode_eof(&mut out));
        if let Err(e) = encoded {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }
}

/// `Content-Type` of [`MetricsRegistry::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::gauge::Gauge;

    #[test]
    fn prefix_build_info_and_late_registration() {
        let registry = MetricsRegistry::new();
        let text = registry.encode();
        assert!(
            text.contains(&format!(
                "eni_operator_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");

        let clone = registry.clone();
        let gauge: Gauge = Gauge::default();
        clone.register("nodes", "Nodes managed", gauge.clone());
        gauge.set(7);
        assert!(registry.encode().contains("eni_operator_nodes 7"));
    }
}
