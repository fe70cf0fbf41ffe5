//! The two read-only ways to run: `--mode=shadow` (watch, plan and compare beside the allocator
//! serving the nodes now) and `eni-operator plan` (read once, print what would be done, exit).
//! Both build the core from the read-only types only ([`Core::shadow`]): the Kubernetes sink
//! and the gated EC2 client are wrapped before the core ever sees them.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use tokio_util::sync::CancellationToken;

use crate::config::{Output, Settings};
use crate::crd::CiliumNode;
use crate::ec2::aws::AwsEc2;
use crate::ec2::gate::{Gate, GateLayer};
use crate::ec2::readonly::ReadOnlyEc2;
use crate::event_loop::core::{Core, NodeInput};
use crate::http::Readiness;
use crate::k8s::readonly::ReadOnlySink;
use crate::k8s::sink::KubeSink;
use crate::k8s::source;
use crate::metrics::MetricsRegistry;
use crate::reconcile::metrics::RuntimeMetrics;
use crate::reconcile::shadow::{ShadowBook, ShadowMetrics, Summary, Would};
use crate::reconcile::status::ThrottledPasses;

/// How long `plan` waits for every node's plan before printing what it has.
const PLAN_TIMEOUT: Duration = Duration::from_secs(60);

type ShadowCore = Core<ReadOnlyEc2<Gate<AwsEc2>>, ReadOnlySink<KubeSink>>;

/// A shadow core on the real clients, its book, and the registry's `/debug/shadow` page.
async fn shadow_core(
    settings: &Settings,
    client: &kube::Client,
    registry: &MetricsRegistry,
) -> anyhow::Result<(ShadowCore, Arc<ShadowBook>)> {
    let aws = AwsEc2::new(&settings.ec2.aws_client_config()).await;
    let layer = GateLayer::new(settings.gate.gate_config()).reporting_throttles_to(ThrottledPasses);
    let gate = Gate::new(aws, layer);
    registry.with(|r| gate.metrics().register(r));
    let ec2 = Arc::new(ReadOnlyEc2::read_only(gate));
    let kube_sink = KubeSink::new(client.clone(), Some(settings.kube.identity().to_string()));
    let sink = Arc::new(ReadOnlySink::read_only(Arc::new(kube_sink)));
    let metrics = registry.with(RuntimeMetrics::register);
    let book = Arc::new(
        ShadowBook::new(registry.with(ShadowMetrics::register))
            .with_refusals(sink.refused_counter(), ec2.refused_counter()),
    );
    let page = book.clone();
    registry.set_debug_page("shadow", move || {
        serde_json::to_value(page.summary()).unwrap_or_default()
    });
    // Derived through the read-only client: describes only.
    let mut settings = settings.clone();
    // Boxed: the read-only gated client nests deeper than the compiler's layout limit.
    Box::pin(crate::cluster_name::settle(&mut settings, client, &*ec2))
        .await
        .map_err(anyhow::Error::msg)?;
    let config = settings.core_config();
    let cache = config.ec2_cache();
    let core = Core::shadow(ec2, sink, config, metrics, cache, book.clone());
    // The same per-node status as the active operator's, from the same passes.
    let status = core.status_book();
    registry.set_debug_page("nodes", move || {
        serde_json::to_value(status.page(crate::clock::now())).unwrap_or_default()
    });
    Ok((core, book))
}

/// `--mode=shadow`: runs until `shutdown`. No Lease: several shadows may run.
pub async fn run_shadow(
    settings: Settings,
    client: kube::Client,
    registry: MetricsRegistry,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    tracing::info!("shadow mode: no writes, no mutating EC2 calls; summary at /debug/shadow");
    let (core, _book) = shadow_core(&settings, &client, &registry).await?;
    readiness.set_leading(true);
    let mut warm = core.warm();
    let caches_warm = async {
        if warm.wait_for(|w| *w).await.is_ok() {
            readiness.set_caches_warm();
        }
        std::future::pending::<()>().await
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    let result = tokio::select! {
        r = core.run(rx, shutdown.cancelled()) => r.map_err(anyhow::Error::from),
        () = source::watch_cilium_nodes(client.clone(), tx.clone(), || readiness.set_nodes_listed()) => Ok(()),
        () = source::watch_nodes(client.clone(), tx.clone()) => Ok(()),
        () = source::watch_pending_pods(client, tx) => Ok(()),
        () = caches_warm => Ok(()),
    };
    readiness.set_stopping();
    result
}

/// `eni-operator plan`: list the CiliumNodes once, plan each on a fresh EC2 view, print.
pub async fn run_plan(settings: Settings, client: kube::Client) -> anyhow::Result<String> {
    let registry = MetricsRegistry::new();
    let (core, book) = shadow_core(&settings, &client, &registry).await?;
    let ar = ApiResource::erase::<CiliumNode>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let list = api.list(&ListParams::default()).await?;
    // Each CiliumNode is judged against its Node (§15), as the active operator does.
    let node_inputs = source::list_nodes(client).await?;
    let mut names: Vec<String> = list
        .items
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    names.sort();
    // Every input is in before the core starts: its first EC2 listing is scoped to the VPC of
    // the nodes it is told of (`event_loop::start`), as the active operator's.
    let (tx, rx) = tokio::sync::mpsc::channel(list.items.len() + node_inputs.len() + 2);
    for input in node_inputs {
        tx.send(input).await?;
    }
    for obj in &list.items {
        tx.send(source::to_input(obj)).await?;
    }
    tx.send(NodeInput::CiliumNodesListed).await?;
    let done = CancellationToken::new();
    let run = tokio::spawn(core.run(rx, done.clone().cancelled_owned()));
    let all_planned = || names.iter().all(|n| book.node(n).is_some());
    let deadline = tokio::time::Instant::now() + PLAN_TIMEOUT;
    while !all_planned() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done.cancel();
    run.await??;
    let summary = book.summary();
    Ok(match settings.mode.output {
        Output::Json => serde_json::to_string_pretty(&plan_json(&summary, &names))? + "\n",
        Output::Table => plan_table(&summary, &names),
    })
}

/// A node that was not planned: opted out, outside `--instance-tags-filter`, being deleted,
/// or its instance was not found in time.
const NOT_PLANNED: &str = "not planned (opted out, out of scope, deleting, or no EC2 data yet)";

/// The action column: what the active operator would do now.
pub fn action_text(would: &Would) -> String {
    match would {
        Would::Nothing => "nothing".into(),
        Would::Assign {
            eni,
            subnet,
            addresses,
        } => format!("assign {addresses} on {eni} ({subnet})"),
        Would::CreateEni {
            subnet,
            security_groups,
            addresses,
        } => format!(
            "create ENI in {subnet} with {addresses} addresses (sg {})",
            security_groups.join(",")
        ),
        Would::Release { eni, addresses } => format!("release {addresses} from {eni}"),
    }
}

/// `plan`'s table: one line per CiliumNode, in name order.
pub fn plan_table(summary: &Summary, names: &[String]) -> String {
    let mut rows = vec![[
        "NODE".to_string(),
        "INSTANCE".into(),
        "MODE".into(),
        "AVAILABLE/USED/NEEDED".into(),
        "ACTION".into(),
    ]];
    for n in names {
        rows.push(match summary.nodes.get(n) {
            Some(s) => [
                n.clone(),
                s.figures.instance.clone(),
                s.figures.mode.to_string(),
                format!(
                    "{}/{}/{}",
                    s.figures.available, s.figures.used, s.figures.needed
                ),
                match &s.error {
                    Some(e) => format!("error: {e}"),
                    None => action_text(&s.would),
                },
            ],
            None => [
                n.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                NOT_PLANNED.into(),
            ],
        });
    }
    crate::text_table::render(&rows)
}

/// `plan --output json`: per node, the figures and the action (or error).
pub fn plan_json(summary: &Summary, names: &[String]) -> serde_json::Value {
    let nodes: Vec<serde_json::Value> = names
        .iter()
        .map(|n| match summary.nodes.get(n) {
            Some(s) => serde_json::json!({
                "node": n,
                "instance": s.figures.instance,
                "mode": s.figures.mode,
                "available": s.figures.available,
                "used": s.figures.used,
                "needed": s.figures.needed,
                "action": s.would,
                "error": s.error,
            }),
            None => serde_json::json!({"node": n, "planned": false, "why": NOT_PLANNED}),
        })
        .collect();
    serde_json::json!({ "nodes": nodes })
}
