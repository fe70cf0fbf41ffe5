//! eni-operator: gives AWS nodes their pod IP capacity through Cilium's CiliumNode objects.
//!
//! Layout (pure logic apart from I/O):
//! * [`crd`]: the CiliumNode wire types.
//! * [`ec2`]: the EC2 trait, the SDK client, the in-memory simulator and the rate-limit gate.
//! * [`ipam`]: the pure engine (demand, capacity, planning, release, write-back).
//! * [`runtime`]: leader election, caches, deficit queue, reconciler, finalizer, GC.
//! * [`config`], [`metrics`], [`http`]: settings, Prometheus registry, health/metrics server.
//! * [`kube_limit`]: the client-side rate limit of Kubernetes API requests.

pub mod bench;
pub mod config;
pub mod crd;
pub mod ec2;
pub mod http;
pub mod ipam;
pub mod kube_limit;
pub mod metrics;
pub mod mutants;
pub mod runtime;
