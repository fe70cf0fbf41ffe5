//! eni-operator: gives AWS nodes their pod IP capacity through Cilium's CiliumNode objects.
//!
//! Layout (pure logic apart from I/O):
//! * [`crd`]: the CiliumNode wire types.
//! * [`ec2`]: the EC2 trait, the SDK client and the rate-limit gate.
//! * [`ipam`]: the pure engine (demand, capacity, planning, release, write-back).
//! * [`k8s`]: the Kubernetes side: watches in, CiliumNode writes out, the Lease.
//! * [`cache`]: the EC2 view (the cache, its refresher, instance-type limits).
//! * [`reconcile`]: one pass over one node, its EC2 actions, Events, status, GC, finalizer.
//! * [`event_loop`]: the allocation core: inputs, the queue's passes, refreshes.
//! * [`config`], [`metrics`], [`http`]: settings, Prometheus registry, health/metrics server.
//! * [`kube_limit`]: the client-side rate limit of Kubernetes API requests.
//! * [`kube_fence`]: the lease fence on each Kubernetes write as it leaves.
//!
//! The test doubles (EC2 simulator, in-memory API server and Lease, agent models) are in the
//! `testkit` crate, the scale benchmark in `bench`: neither ships in this library.
//!
//! References: `§N` in a comment is section N of `docs/rules.md`, `C1`-`C10` are the rules at
//! its top; `docs/ciliumnode.md` lists the CiliumNode fields we read and write, and
//! `docs/architecture.md` shows where each step of the work lives. A test (`tests/it/docs.rs`)
//! checks that every such reference resolves.

#![forbid(unsafe_code)]

pub mod cache;
pub mod clock;
pub mod cluster_name;
pub mod config;
pub mod crd;
pub mod credentials;
pub mod ec2;
pub mod event_loop;
pub mod http;
pub mod ipam;
pub mod jitter;
pub mod k8s;
pub mod kube_fence;
pub mod kube_limit;
pub mod kube_metrics;
pub mod metrics;
pub mod metrics_compat;
pub mod modes;
pub mod mutants;
pub mod process_metrics;
pub mod reconcile;
pub mod status_cli;
pub mod text_table;
pub mod uninstall;
