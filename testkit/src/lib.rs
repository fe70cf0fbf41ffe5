//! Test doubles of eni-operator's world, shared by the operator's tests, the benchmark (`bench/`),
//! the deterministic simulation (`dst/`) and the end-to-end suite (`e2e/`). Each models the real
//! system and says where that knowledge comes from:
//! * [`sim`]: an in-memory EC2 following AWS's documented rules (docs/emulators.md);
//! * [`sink`]: an in-memory API server for CiliumNodes and Nodes ([`sink::MemorySink`]), with
//!   the structural pruning of [`prune`];
//! * [`lease`]: an in-memory Lease for the leader-election tests;
//! * [`managed_fields`]: who set each annotation and our finalizer, as the API server records it
//!   in `metadata.managedFields` ([`sink::MemorySink`] keeps them);
//! * [`world`]: the EC2 world the contract suite seeds in the simulator and in moto;
//! * [`cluster`]: the simulated cluster of the runtime tests (a VPC, a subnet, m5.large nodes);
//! * [`control_plane`]: a real etcd + kube-apiserver + kube-controller-manager from
//!   `KUBEBUILDER_ASSETS` (and the `control-plane` binary that runs one);
//! * [`agent`]: one pure model of each Cilium agent generation (classic, multi-pool);
//! * [`running`]: a core started as the runtime tests start one;
//! * [`cilium_operator`]: the flags and environment that start Cilium's own operator here;
//! * [`wait_until`], [`served`]: the waits and checks the runtime tests share.
//!
//! Not part of the operator's library: a dev-dependency of its tests and a dependency of the
//! tools only.

pub mod agent;
pub mod cilium_operator;
pub mod cilium_signals;
pub mod cluster;
pub mod control_plane;
pub mod lease;
pub mod managed_fields;
pub mod other_allocator;
pub mod prune;
pub mod running;
pub mod sim;
pub mod sink;
pub mod wire;
pub mod world;

use std::time::Duration;

use sink::MemorySink;

/// Polls `cond` on tokio time (paused or real) until it holds or `limit` has passed; the last
/// answer of `cond` is the result.
pub async fn wait_until(mut cond: impl FnMut() -> bool, limit: Duration) -> bool {
    let step = Duration::from_millis(250);
    let mut waited = Duration::ZERO;
    while waited < limit {
        if cond() {
            return true;
        }
        tokio::time::sleep(step).await;
        waited += step;
    }
    cond()
}

/// A child's stdin: a pipe when there is input to give it, else nothing.
pub fn piped_if(input: bool) -> std::process::Stdio {
    if input {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    }
}

/// Every page of a describe ([`collect_pages`]), which the test expects to succeed.
///
/// [`collect_pages`]: eni_operator::ec2::collect_pages
pub async fn every_page<T, F, Fut>(call: F) -> Vec<T>
where
    T: eni_operator::ec2::Listed,
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = eni_operator::ec2::Result<eni_operator::ec2::Page<T>>>,
{
    let listed = eni_operator::ec2::collect_pages(call).await;
    listed.unwrap_or_else(|e| panic!("{:?}: {e}", T::OPERATION))
}

/// Waits up to `limit` until every node of `names` is [`served`] with `want` addresses.
pub async fn all_served(
    sink: &MemorySink,
    names: &[impl AsRef<str>],
    want: usize,
    limit: Duration,
) -> bool {
    wait_until(
        || names.iter().all(|n| served(sink, n.as_ref(), want)),
        limit,
    )
    .await
}

/// C2 + demand: every pool address is listed on its ENI in status, and the pool holds at least
/// `want` addresses.
pub fn served(sink: &MemorySink, name: &str, want: usize) -> bool {
    let Some(n) = sink.get(name) else {
        return false;
    };
    let enis = n.status.map(|s| s.eni.enis).unwrap_or_default();
    n.spec.ipam.pool.len() >= want
        && n.spec.ipam.pool.iter().all(|(ip, a)| {
            enis.get(&a.resource)
                .is_some_and(|e| e.addresses.iter().any(|x| x == ip))
        })
}
