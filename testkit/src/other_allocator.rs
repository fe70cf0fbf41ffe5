//! A scripted "other allocator": plays Cilium's operator in ENI mode on the simulator and a
//! `MemorySink`, so shadow-mode and handover tests have someone else serving the nodes.
//!
//! What it models of Cilium's operator (`pkg/ipam/node.go`, `pkg/aws/eni/node.go`): per node,
//! one allocation round at a time; it computes the deficit from the CiliumNode with Cilium's
//! formula (`ipam::demand::needed`), tops up the last secondary ENI that has room, else creates
//! and attaches a new one (description `Cilium-CNI (<instance-id>)`, device index after the
//! highest in use, never the primary ENI with `first-interface-index` 1), then writes
//! `spec.ipam.pool` and `status.eni.enis` from EC2's view of the instance. It is slower than
//! eni-operator by design: the test decides how often [`OtherAllocator::round`] runs (Cilium's
//! operator resyncs per node on a timer and a rate-limited trigger).
//!
//! Its writes carry Cilium's field manager, [`CILIUM_OPERATOR_MANAGER`]: client-go's default
//! field manager is the binary name from the user agent, and the ENI-mode operator binary is
//! `cilium-operator-aws`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use eni_operator::crd::{AllocationIp, CiliumNode, EniEntry};
use eni_operator::ec2::{AddressRequest, CreateEniRequest, Ec2, NetworkInterface, Tags};
use eni_operator::ipam::demand;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

use crate::sim::Simulator;
use crate::sink::MemorySink;

pub const CILIUM_OPERATOR_MANAGER: &str = "cilium-operator-aws";

/// Addresses per ENI of an m5.large, primary excluded (10 per ENI).
const SECONDARY_PER_ENI: u32 = 9;

pub struct OtherAllocator {
    sim: Simulator,
    /// Where it creates ENIs and with which security groups (Cilium: `spec.eni.subnet-ids` /
    /// tags, `security-groups` / `security-group-tags`, or the primary ENI's).
    pub subnet: String,
    pub security_groups: Vec<String>,
    /// Mutating EC2 calls it made (so a test can tell its calls from anyone else's).
    mutating_calls: AtomicU64,
    writes: AtomicU64,
}

impl OtherAllocator {
    pub fn new(sim: Simulator, subnet: &str, security_groups: &[String]) -> Self {
        Self {
            sim,
            subnet: subnet.into(),
            security_groups: security_groups.to_vec(),
            mutating_calls: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        }
    }

    pub fn mutating_calls(&self) -> u64 {
        self.mutating_calls.load(Ordering::Relaxed)
    }

    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// One allocation round over `names`: at most one EC2 action per node. Returns the
    /// CiliumNodes it wrote (as a watch would deliver them).
    pub async fn round(&self, sink: &MemorySink, names: &[String]) -> Vec<CiliumNode> {
        self.act(sink, names).await;
        self.write(sink, names)
    }

    /// A round's EC2 half: its calls, no write. Cilium's operator writes after its calls, and
    /// can write much later: 1.16 wrote a pool about 30 s after the assign that filled it, when
    /// the describe that follows an assign failed (e2e `cilium-shadow`, its log).
    pub async fn act(&self, sink: &MemorySink, names: &[String]) {
        for node in names.iter().filter_map(|n| sink.get(n)) {
            let needed = needed(&node);
            if node.metadata.deletion_timestamp.is_none() && needed > 0 {
                self.allocate(&node, needed as u32).await;
            }
        }
    }

    /// A round's write half: publishes what EC2 holds; the CiliumNodes it wrote.
    pub fn write(&self, sink: &MemorySink, names: &[String]) -> Vec<CiliumNode> {
        names
            .iter()
            .filter_map(|n| sink.get(n))
            .filter(|node| node.metadata.deletion_timestamp.is_none())
            .filter_map(|node| self.publish(sink, &node))
            .collect()
    }

    async fn allocate(&self, node: &CiliumNode, needed: u32) {
        let instance = &node.spec.instance_id;
        let enis = self.sim.secondary_enis(instance);
        let room =
            |e: &NetworkInterface| SECONDARY_PER_ENI.saturating_sub(e.secondary_ips.len() as u32);
        if let Some(eni) = enis.iter().rev().find(|e| room(e) > 0) {
            let n = needed.min(room(eni));
            self.mutating_calls.fetch_add(1, Ordering::Relaxed);
            let _ = self
                .sim
                .assign_private_ip_addresses(&eni.id, AddressRequest::Ips(n))
                .await;
            return;
        }
        if enis.len() >= 2 {
            return; // m5.large: 3 ENIs, the primary is not Cilium's to use
        }
        let index = enis
            .iter()
            .filter_map(|e| e.attachment.as_ref().map(|a| a.device_index))
            .max()
            .unwrap_or(0)
            + 1;
        let request = CreateEniRequest {
            subnet_id: self.subnet.clone(),
            security_groups: self.security_groups.clone(),
            description: format!("Cilium-CNI ({instance})"),
            tags: Tags::new(),
            addresses: AddressRequest::Ips(needed.min(SECONDARY_PER_ENI)),
            client_token: format!("other-{instance}-{index}"),
        };
        self.mutating_calls.fetch_add(1, Ordering::Relaxed);
        let Ok(eni) = self.sim.create_network_interface(&request).await else {
            return;
        };
        self.mutating_calls.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sim
            .attach_network_interface(&eni.id, instance, index)
            .await;
    }

    /// Write the pool and `status.eni.enis` as Cilium's operator does, if they changed.
    fn publish(&self, sink: &MemorySink, node: &CiliumNode) -> Option<CiliumNode> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let enis = self.sim.secondary_enis(&node.spec.instance_id);
        let mut pool = BTreeMap::new();
        let mut entries = BTreeMap::new();
        for e in &enis {
            for ip in &e.secondary_ips {
                pool.insert(
                    ip.to_string(),
                    AllocationIp {
                        resource: e.id.clone(),
                        ..Default::default()
                    },
                );
            }
            let mut entry = EniEntry {
                id: e.id.clone(),
                ip: e.primary_ip.to_string(),
                mac: e.mac.clone(),
                availability_zone: e.availability_zone.clone(),
                description: e.description.clone(),
                number: e
                    .attachment
                    .as_ref()
                    .map_or(0, |a| i64::from(a.device_index)),
                addresses: e.secondary_ips.iter().map(|ip| ip.to_string()).collect(),
                security_groups: e.security_groups.clone(),
                ..Default::default()
            };
            entry.subnet.id = e.subnet_id.clone();
            entry.vpc.id = e.vpc_id.clone();
            entries.insert(e.id.clone(), entry);
        }
        let same_status = node.status.as_ref().is_some_and(|s| s.eni.enis == entries)
            || (entries.is_empty() && node.status.is_none());
        if node.spec.ipam.pool == pool && same_status {
            return None;
        }
        self.writes.fetch_add(1, Ordering::Relaxed);
        sink.update(&name, |n| {
            n.spec.ipam.pool = pool;
            n.status.get_or_insert_with(Default::default).eni.enis = entries;
            n.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
                manager: Some(CILIUM_OPERATOR_MANAGER.into()),
                operation: Some("Update".into()),
                ..Default::default()
            }]);
        })
    }
}

/// Cilium's deficit of a classic node: needed(A, U, P, m, M).
pub fn needed(node: &CiliumNode) -> i64 {
    let Ok(m) = demand::watermarks(node) else {
        return 0;
    };
    let available = node.spec.ipam.pool.len() as i64;
    let used = demand::used_addresses(node).len() as i64;
    demand::needed(
        available,
        used,
        m.pre_allocate,
        m.min_allocate,
        m.max_allocate,
    )
}
