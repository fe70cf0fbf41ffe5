//! `eni-operator status [--address URL] [--output table|json]`: reads `/debug/nodes` from a
//! running operator (its debug listener, on its node or through `kubectl port-forward`) and
//! prints every node's status: demand figures, last action, next action, and why it waits.
//! The rendering ([`table`]) is pure.

use std::fmt::Write as _;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::reconcile::status::page::Page;

/// Read a running operator's per-node status (`/debug/nodes`).
#[derive(Parser, Debug)]
#[command(name = "eni-operator status")]
pub struct StatusArgs {
    /// The operator's debug address (`--debug-addr`, loopback on its node), e.g. after
    /// `kubectl -n kube-system port-forward deploy/eni-operator 9753`.
    #[arg(
        long,
        env = "ENI_OPERATOR_STATUS_ADDRESS",
        default_value = "http://127.0.0.1:9753"
    )]
    pub address: String,
    #[arg(long, value_enum, default_value_t = StatusOutput::Table)]
    pub output: StatusOutput,
    /// Only the nodes that wait.
    #[arg(long)]
    pub waiting: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum StatusOutput {
    Table,
    Json,
}

/// Fetch the page at `address` (`http://host:port`; the scheme may be left out).
pub async fn fetch(address: &str) -> anyhow::Result<Page> {
    let base = if address.contains("://") {
        address.trim_end_matches('/').to_string()
    } else {
        format!("http://{}", address.trim_end_matches('/'))
    };
    let uri: http::Uri = format!("{base}/debug/nodes")
        .parse()
        .with_context(|| format!("bad address {address:?}"))?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let response = client
        .get(uri.clone())
        .await
        .with_context(|| format!("cannot reach {uri}"))?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    if status == http::StatusCode::NOT_FOUND {
        anyhow::bail!("{uri}: 404 (not the leader yet, or an eni-operator older than this page)");
    }
    if !status.is_success() {
        anyhow::bail!("{uri}: HTTP {status}");
    }
    serde_json::from_slice(&body).with_context(|| format!("{uri}: not a status page"))
}

/// `status`'s output.
pub fn render(page: &Page, output: StatusOutput, waiting_only: bool) -> String {
    let mut page = page.clone();
    if waiting_only {
        page.nodes.retain(|_, n| n.waiting.is_some());
    }
    match output {
        StatusOutput::Json => serde_json::to_string_pretty(&page).unwrap_or_default() + "\n",
        StatusOutput::Table => table(&page),
    }
}

/// One line per node, then why each waiting node waits and the last errors. Text from the
/// cluster is shown with its control characters escaped.
pub fn table(page: &Page) -> String {
    use crate::text_table::printable;
    let mut rows = vec![[
        "NODE".to_string(),
        "MODE".into(),
        "AVAIL/USED/NEEDED".into(),
        "LAST ACTION".into(),
        "NEXT".into(),
        "WAITS".into(),
    ]];
    for (name, n) in &page.nodes {
        let f = &n.figures;
        rows.push([
            name.clone(),
            f.mode.clone(),
            format!("{}/{}/{}", f.available, f.used, f.needed),
            n.last_action
                .as_ref()
                .map_or("-".into(), |a| format!("{} at {}", a.what.describe(), a.at)),
            n.next.describe(),
            match &n.waiting {
                Some(w) => w.reason.as_str().to_string(),
                None if n.running => "(pass running)".into(),
                None => "-".into(),
            },
        ]);
    }
    let mut out = crate::text_table::render(&rows);
    let t = &page.totals;
    let _ = writeln!(
        out,
        "\n{} nodes, {} waiting, {} with an error",
        t.nodes, t.nodes_waiting, t.nodes_with_errors
    );
    let waiting = page.nodes.iter().filter_map(|(name, n)| {
        let w = n.waiting.as_ref()?;
        let retry = match (&w.retry_at, w.retry_in_seconds) {
            (Some(at), Some(s)) => format!("retried at {at} (in {s:.0} s)"),
            _ => "retried at its next update or the next rescan".into(),
        };
        Some(format!(
            "  {}: {}: {}; {retry}",
            printable(name),
            w.reason.as_str(),
            printable(&w.detail)
        ))
    });
    section(&mut out, "Why nodes wait:", waiting);
    let errors = page.nodes.iter().filter_map(|(name, n)| {
        let e = n.last_error.as_ref()?;
        let (name, message) = (printable(name), printable(&e.what.message));
        Some(format!("  {name} at {}: {message}", e.at))
    });
    section(&mut out, "Last errors:", errors);
    out
}

/// `lines` under `title`, after a blank line; nothing at all when there are none.
fn section(out: &mut String, title: &str, lines: impl Iterator<Item = String>) {
    let mut lines = lines.peekable();
    if lines.peek().is_some() {
        let _ = writeln!(out, "\n{title}");
    }
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
}

/// `eni-operator status ...` (`args` without the program name's `status`).
pub async fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> std::process::ExitCode {
    let args = match StatusArgs::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    match fetch(&args.address).await {
        Ok(page) => {
            print!("{}", render(&page, args.output, args.waiting));
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::status::page::{NodeStatus, Wait};
    use crate::reconcile::status::{Figures, WaitReason, Would};

    fn page() -> Page {
        let mut p = Page::default();
        p.nodes.insert(
            "a".into(),
            NodeStatus {
                figures: Figures {
                    instance: "i-1".into(),
                    mode: "classic".into(),
                    available: 8,
                    used: 3,
                    needed: 0,
                },
                ..NodeStatus::default()
            },
        );
        p.nodes.insert(
            "b".into(),
            NodeStatus {
                next: Would::Assign {
                    eni: "eni-2".into(),
                    subnet: "subnet-a".into(),
                    addresses: 8,
                },
                waiting: Some(Wait {
                    reason: WaitReason::Throttled,
                    detail: "AssignPrivateIpAddresses answered RequestLimitExceeded".into(),
                    retry_at: Some("2026-01-01T00:00:03Z".into()),
                    retry_in_seconds: Some(3.0),
                }),
                ..NodeStatus::default()
            },
        );
        p.totals.nodes = 2;
        p.totals.nodes_waiting = 1;
        p
    }

    #[test]
    fn the_table_says_why_each_waiting_node_waits_and_when_it_is_retried() {
        let out = table(&page());
        assert!(out.contains("assign 8 on eni-2"), "{out}");
        assert!(
            out.contains("  b: throttled: AssignPrivateIpAddresses answered RequestLimitExceeded; retried at 2026-01-01T00:00:03Z (in 3 s)"),
            "{out}"
        );
        assert!(out.contains("2 nodes, 1 waiting"), "{out}");
        assert!(!out.contains("  a: "), "a does not wait: {out}");
    }

    /// Node names and messages come from the cluster (an agent writes what ends up in them):
    /// an escape sequence or a line break in one is shown escaped, never acted on.
    #[test]
    fn the_table_escapes_control_characters() {
        let mut p = page();
        let b = p.nodes.remove("b").unwrap();
        let mut wait = b.waiting.clone().unwrap();
        wait.detail = "spec says \u{1b}]0;owned\u{7}\n  c: fine".into();
        p.nodes.insert(
            "b\u{1b}[2J".into(),
            NodeStatus {
                waiting: Some(wait),
                ..b
            },
        );
        let out = table(&p);
        assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
        assert!(out.contains("b\\u{1b}[2J"), "{out}");
        assert!(out.contains("\\u{1b}]0;owned\\u{7}\\n  c: fine"), "{out}");
        assert!(!out.lines().any(|l| l.starts_with("  c: ")), "{out}");
    }

    #[test]
    fn json_output_round_trips_and_can_keep_only_waiting_nodes() {
        let out = render(&page(), StatusOutput::Json, true);
        let back: Page = serde_json::from_str(&out).unwrap();
        assert_eq!(back.nodes.keys().collect::<Vec<_>>(), ["b"]);
        assert_eq!(
            back.nodes["b"].waiting.as_ref().unwrap().reason,
            WaitReason::Throttled
        );
    }

    #[tokio::test]
    async fn fetch_reads_the_page_a_running_operator_serves() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let registry = crate::metrics::MetricsRegistry::new();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let server = crate::http::start_on(
            vec![(listener, crate::http::Endpoints::ALL)],
            registry.clone(),
            crate::http::Readiness::new(),
            shutdown.clone(),
        )
        .unwrap();
        let addr = server.metrics_addr.to_string();
        assert!(fetch(&addr).await.unwrap_err().to_string().contains("404"));
        let p = page();
        registry.set_debug_page("nodes", move || serde_json::to_value(&p).unwrap());
        assert_eq!(fetch(&addr).await.unwrap(), page());
        shutdown.cancel();
        server.task.await.unwrap().unwrap();
    }
}
