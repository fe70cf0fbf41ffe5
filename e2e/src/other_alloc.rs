//! A scripted "other allocator" over the real API server and EC2 endpoint: it plays Cilium's
//! operator in ENI mode beside the operator under test (shadow and handover scenarios).
//!
//! The same model as `testkit/src/other_allocator.rs` (which runs on the simulator and a
//! MemorySink): per node, Cilium's deficit (`testkit::other_allocator::needed`, from
//! `pkg/ipam/node.go`), a secondary ENI described `Cilium-CNI (<instance-id>)` at device index
//! 1, then `spec.ipam.pool` and `status.eni.enis` written with Cilium's field manager
//! (`cilium-operator-aws`: client-go's default, the binary's name). Slower than eni-operator on
//! purpose: the scenario calls [`OtherAllocator::round`] on its own timer, and one round adds
//! at most [`STEP`] addresses per node.

use std::collections::BTreeMap;
use std::sync::Mutex;

use anyhow::{Context, Result};
use aws_sdk_ec2::Client;
use eni_operator::crd::{AllocationIp, CiliumNode, EniEntry};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use testkit::other_allocator::CILIUM_OPERATOR_MANAGER;

use crate::ec2seed::{Instance, World, instance_enis};

/// Addresses one round adds to a node at most (Cilium's operator is rate-limited per node).
pub const STEP: i64 = 4;

pub struct OtherAllocator {
    kube: kube::Client,
    ec2: Client,
    world: World,
    /// Instance -> the ENI it made there.
    enis: Mutex<BTreeMap<String, String>>,
    /// Mutating EC2 calls it made.
    pub mutating_calls: std::sync::atomic::AtomicUsize,
}

impl OtherAllocator {
    pub fn new(kube: kube::Client, ec2: Client, world: World) -> Self {
        Self {
            kube,
            ec2,
            world,
            enis: Mutex::new(BTreeMap::new()),
            mutating_calls: Default::default(),
        }
    }

    fn cns(&self) -> Api<CiliumNode> {
        Api::all(self.kube.clone())
    }

    fn count(&self) {
        self.mutating_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// One round over these nodes (name, instance, zone index): top up, then publish.
    pub async fn round(&self, nodes: &[(String, Instance, usize)]) -> Result<()> {
        for (name, inst, zone) in nodes {
            let Some(cn) = self.cns().get_opt(name).await? else {
                continue;
            };
            if cn.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let needed = testkit::other_allocator::needed(&cn).min(STEP);
            if needed > 0 {
                self.allocate(inst, *zone, needed as i32).await?;
            }
            self.publish(name, &cn, inst).await?;
        }
        Ok(())
    }

    async fn allocate(&self, inst: &Instance, zone: usize, n: i32) -> Result<()> {
        let known = self.enis.lock().expect("poisoned").get(&inst.id).cloned();
        if let Some(eni) = known {
            let room = crate::checks::ips_per_eni(&inst.instance_type).unwrap_or(9) as i32;
            let have = instance_enis(&self.ec2, &inst.id)
                .await?
                .into_iter()
                .find(|e| e.id == eni)
                .map_or(0, |e| e.addresses.len() as i32);
            let n = n.min(room - have);
            if n > 0 {
                self.count();
                self.ec2
                    .assign_private_ip_addresses()
                    .network_interface_id(&eni)
                    .secondary_private_ip_address_count(n)
                    .send()
                    .await
                    .context("other allocator: AssignPrivateIpAddresses")?;
            }
            return Ok(());
        }
        let subnet = self.world.pod_subnet(zone).id.clone();
        self.count();
        let created = self
            .ec2
            .create_network_interface()
            .subnet_id(&subnet)
            .groups(&self.world.pod_security_group)
            .description(format!("Cilium-CNI ({})", inst.id))
            .secondary_private_ip_address_count(n)
            .send()
            .await
            .context("other allocator: CreateNetworkInterface")?;
        let eni = created
            .network_interface()
            .and_then(|e| e.network_interface_id())
            .context("CreateNetworkInterface: no ID")?
            .to_string();
        self.count();
        let attached = self
            .ec2
            .attach_network_interface()
            .network_interface_id(&eni)
            .instance_id(&inst.id)
            .device_index(1)
            .send()
            .await
            .context("other allocator: AttachNetworkInterface")?;
        // As Cilium's operator: the ENI goes with its instance.
        if let Some(attachment) = attached.attachment_id() {
            self.count();
            let _ = self
                .ec2
                .modify_network_interface_attribute()
                .network_interface_id(&eni)
                .attachment(
                    aws_sdk_ec2::types::NetworkInterfaceAttachmentChanges::builder()
                        .attachment_id(attachment)
                        .delete_on_termination(true)
                        .build(),
                )
                .send()
                .await;
        }
        self.enis
            .lock()
            .expect("poisoned")
            .insert(inst.id.clone(), eni);
        Ok(())
    }

    /// `spec.ipam.pool` and `status.eni.enis` from EC2's view of its ENI, when they differ.
    async fn publish(&self, name: &str, cn: &CiliumNode, inst: &Instance) -> Result<()> {
        let Some(eni_id) = self.enis.lock().expect("poisoned").get(&inst.id).cloned() else {
            return Ok(());
        };
        let Some(eni) = instance_enis(&self.ec2, &inst.id)
            .await?
            .into_iter()
            .find(|e| e.id == eni_id)
        else {
            return Ok(());
        };
        // EniView's addresses are the secondary ones (the primary is no pod address).
        let secondary = eni.addresses.clone();
        let pool: BTreeMap<String, AllocationIp> = secondary
            .iter()
            .map(|ip| {
                (
                    ip.clone(),
                    AllocationIp {
                        resource: eni.id.clone(),
                        ..Default::default()
                    },
                )
            })
            .collect();
        if cn.spec.ipam.pool == pool {
            return Ok(());
        }
        let pp = PatchParams {
            field_manager: Some(CILIUM_OPERATOR_MANAGER.into()),
            ..Default::default()
        };
        let mut entry = EniEntry {
            id: eni.id.clone(),
            availability_zone: inst.az.clone(),
            description: format!("Cilium-CNI ({})", inst.id),
            number: 1,
            addresses: secondary,
            security_groups: vec![self.world.pod_security_group.clone()],
            ..Default::default()
        };
        entry.vpc.id = self.world.vpc_id.clone();
        let api = self.cns();
        for write in publish_writes(&pool, &entry) {
            match write {
                Write::Status(patch) => api
                    .patch_status(name, &pp, &Patch::Merge(patch))
                    .await
                    .context("other allocator: writing status.eni.enis")?,
                Write::Spec(patch) => api
                    .patch(name, &pp, &Patch::Merge(patch))
                    .await
                    .context("other allocator: writing spec.ipam.pool")?,
            };
        }
        Ok(())
    }
}

/// One merge patch of a publish: to `/status` or to the main resource.
#[derive(Debug, PartialEq)]
enum Write {
    Status(serde_json::Value),
    Spec(serde_json::Value),
}

/// The writes that publish `entry` and its `pool`, in the order Cilium's operator makes them:
/// `status.eni.enis` first, so that an agent reading between the two writes never sees a pool
/// address its ENI does not list (rule C2; an agent ignores such an update whole).
fn publish_writes(pool: &BTreeMap<String, AllocationIp>, entry: &EniEntry) -> [Write; 2] {
    [
        Write::Status(json!({"status": {"eni": {"enis": {entry.id.clone(): entry}}}})),
        Write::Spec(json!({"spec": {"ipam": {"pool": pool}}})),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node whose ENI holds `n` addresses, published consistently.
    fn published(n: usize) -> (BTreeMap<String, AllocationIp>, EniEntry) {
        let addresses: Vec<String> = (1..=n).map(|i| format!("10.0.0.{i}")).collect();
        let pool = addresses
            .iter()
            .map(|ip| {
                let a = AllocationIp {
                    resource: "eni-1".into(),
                    ..Default::default()
                };
                (ip.clone(), a)
            })
            .collect();
        let entry = EniEntry {
            id: "eni-1".into(),
            addresses,
            ..Default::default()
        };
        (pool, entry)
    }

    #[test]
    fn an_agent_reading_between_the_two_writes_sees_a_consistent_node() {
        let (pool, entry) = published(4);
        let mut cn = serde_json::to_value(CiliumNode::new("n", Default::default())).unwrap();
        for w in publish_writes(&pool, &entry) {
            let (Write::Status(p) | Write::Spec(p)) = w;
            json_patch::merge(&mut cn, &p);
        }
        // A round adds four addresses: every state the agent can read on the way is valid.
        let (more, grown) = published(8);
        for w in publish_writes(&more, &grown) {
            let (Write::Status(p) | Write::Spec(p)) = w;
            json_patch::merge(&mut cn, &p);
            let seen: CiliumNode = serde_json::from_value(cn.clone()).unwrap();
            let c2 = testkit::agent::c2_violations(&seen);
            assert!(
                c2.is_empty(),
                "an agent reading now ignores the update: {c2:?}"
            );
        }
    }
}
