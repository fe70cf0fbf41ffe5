//! The standard process metrics (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_open_fds`, `process_start_time_seconds`, ...; the names and meanings of
//! Prometheus' client libraries), read on each scrape by the `metrics-process` crate (the
//! port of client_golang's collector) and exposed through a prometheus-client [`Collector`]
//! without the `eni_operator` prefix, as every exporter names them.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Register it in a registry whose prefix is `process`.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = metrics_process::collector::collect();
        if let Some(v) = m.cpu_seconds_total {
            let c = ConstCounter::new(v);
            let help = "Total user and system CPU time spent in seconds";
            c.encode(encoder.encode_descriptor("cpu_seconds", help, None, c.metric_type())?)?;
        }
        let gauges = [
            ("open_fds", "Number of open file descriptors", m.open_fds),
            (
                "max_fds",
                "Maximum number of open file descriptors",
                m.max_fds,
            ),
            (
                "virtual_memory_bytes",
                "Virtual memory size in bytes",
                m.virtual_memory_bytes,
            ),
            (
                "virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes",
                m.virtual_memory_max_bytes,
            ),
            (
                "resident_memory_bytes",
                "Resident memory size in bytes",
                m.resident_memory_bytes,
            ),
            (
                "start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                m.start_time_seconds,
            ),
            ("threads", "Number of OS threads in the process", m.threads),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let g = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
                g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[test]
    fn the_standard_names_carry_this_process_figures() {
        let mut r = Registry::default();
        r.sub_registry_with_prefix("process")
            .register_collector(Box::new(ProcessCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        let value = |name: &str| -> f64 {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in {text}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert!(value("process_resident_memory_bytes") > 1e6, "{text}");
        assert!(value("process_open_fds") >= 3.0, "{text}");
        assert!(value("process_start_time_seconds") > 1.6e9, "{text}");
        assert!(value("process_cpu_seconds_total") >= 0.0, "{text}");
        assert!(
            text.contains("# TYPE process_cpu_seconds counter"),
            "{text}"
        );
    }
}
