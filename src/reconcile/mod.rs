//! One pass over one node and everything it acts through: the [`pass`] steps, what passes share
//! ([`shared`], its [`settings`]), the node slots and identities ([`nodes`], [`identity`],
//! pure), the queue's verdicts ([`queue`], pure), the EC2 actions ([`executor`]), the node
//! deletion ([`finalizer`]) and leaked-ENI collection ([`gc`]), and what the passes report:
//! Events ([`events`]), per-node status ([`status`]), shadow mode's book ([`shadow`]), metrics
//! ([`metrics`], [`metrics_cilium`]). It knows nothing of the event loop that runs it.

pub mod events;
pub mod executor;
pub mod finalizer;
pub mod gc;
pub mod identity;
pub mod metrics;
pub mod metrics_cilium;
pub mod nodes;
pub(crate) mod pass;
pub mod queue;
pub mod settings;
pub mod shadow;
pub(crate) mod shared;
pub mod status;
