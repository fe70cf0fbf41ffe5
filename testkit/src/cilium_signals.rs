//! What Cilium's operator leaves behind when it serves a node, for the handover guard's tests:
//! a `metadata.managedFields` entry of its field manager owning the pool (client-go's `Update`
//! takes the manager from the binary name, `cilium-operator-aws`), the ignore annotation as
//! `kubectl annotate` sets it, and its leader Lease, renewed (`cilium-operator-resource-lock`,
//! 15 s lease; `operator/cmd/root.go`). `MemorySink` keeps `managedFields` as given, so a test
//! writes here what the API server would record.

use eni_operator::crd::{CILIUM_IGNORE_ANNOTATION, CiliumNode};
use eni_operator::ipam::handover::{LeaseView, OWN_FIELD_MANAGER};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

/// Cilium's operator's field manager (AWS build).
pub const CILIUM_OPERATOR_MANAGER: &str = "cilium-operator-aws";

fn entry(
    manager: &str,
    subresource: Option<&str>,
    at: Timestamp,
    fields: Value,
) -> ManagedFieldsEntry {
    ManagedFieldsEntry {
        manager: Some(manager.into()),
        operation: Some("Update".into()),
        subresource: subresource.map(Into::into),
        time: Some(Time(at)),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(fields)),
        api_version: Some("cilium.io/v2".into()),
    }
}

/// Replace `manager`'s entry for `subresource` (the API server keeps one per manager,
/// operation and subresource).
fn record(node: &mut CiliumNode, e: ManagedFieldsEntry) {
    let entries = node.metadata.managed_fields.get_or_insert_with(Vec::new);
    entries.retain(|x| !(x.manager == e.manager && x.subresource == e.subresource));
    entries.push(e);
}

/// Cilium's operator wrote `spec.ipam.pool` at `at`.
pub fn cilium_pool_write(node: &mut CiliumNode, at: Timestamp) {
    let fields = json!({"f:spec": {"f:ipam": {"f:pool": {}}}});
    record(node, entry(CILIUM_OPERATOR_MANAGER, None, at, fields));
}

/// eni-operator last wrote the object (finalizer, pool) at `at`.
pub fn own_write(node: &mut CiliumNode, at: Timestamp) {
    let fields = json!({"f:metadata": {"f:finalizers": {}}});
    record(node, entry(OWN_FIELD_MANAGER, None, at, fields));
}

/// `kubectl annotate cn NAME ipam.cilium.io/ignore=true` at `at`.
pub fn annotated_ignore(node: &mut CiliumNode, at: Timestamp) {
    node.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(CILIUM_IGNORE_ANNOTATION.into(), "true".into());
    let key = format!("f:{CILIUM_IGNORE_ANNOTATION}");
    let fields = json!({"f:metadata": {"f:annotations": {key: {}}}});
    record(node, entry("kubectl-annotate", None, at, fields));
}

/// Cilium operator's Lease, held by `holder` since `acquired`, just renewed at `now`.
pub fn cilium_lease(holder: &str, acquired: Timestamp, now: Timestamp) -> LeaseView {
    LeaseView {
        holder: holder.into(),
        acquired,
        renewed: now,
        duration: std::time::Duration::from_secs(15),
    }
}

/// Cilium's operator creates and attaches an ENI to `instance` (its description, no tags of
/// ours: `pkg/aws/eni/node.go`, `CreateInterface`), at `device_index`.
pub async fn cilium_creates_eni(
    c: &crate::cluster::Cluster,
    instance: &str,
    device_index: u32,
) -> String {
    cilium_creates_eni_with(c, instance, device_index, 2)
        .await
        .id
}

/// [`cilium_creates_eni`] with `ips` secondary addresses; the ENI as created (the truth, whatever
/// a lagging describe shows).
pub async fn cilium_creates_eni_with(
    c: &crate::cluster::Cluster,
    instance: &str,
    device_index: u32,
    ips: u32,
) -> eni_operator::ec2::NetworkInterface {
    use eni_operator::ec2::{AddressRequest, CreateEniRequest, Ec2};
    let request = CreateEniRequest {
        subnet_id: c.subnet.clone(),
        security_groups: vec![c.sg.clone()],
        description: eni_operator::ipam::handover::cilium_eni_description(instance),
        tags: Default::default(),
        addresses: AddressRequest::Ips(ips),
        client_token: format!("cilium-{instance}-{device_index}"),
    };
    let eni = c
        .sim
        .create_network_interface(&request)
        .await
        .expect("create");
    c.sim
        .attach_network_interface(&eni.id, instance, device_index)
        .await
        .expect("attach");
    eni
}
