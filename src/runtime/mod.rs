//! The running operator: leader election, caches, deficit queue, reconciler, finalizer, GC.
//!
//! Pure parts ([`queue`], [`cache`], [`nodes`], [`schedule`], the GC's decision in [`gc`]) are
//! separate from I/O ([`refresher`], [`executor`], [`sink`], [`source`], [`leader`]'s lease
//! locks). The allocation [`core`] takes its input through a channel and writes through a
//! [`sink::NodeSink`], so it runs without Kubernetes (tests, benchmark). Its event loop runs
//! one pass per node as named steps (`pass`: snapshot, lifecycle, plan, execute, write,
//! report); every Event goes out through [`events`].

pub mod cache;
pub mod cilium_lease;
pub mod cilium_version;
pub mod clock;
pub mod core;
mod event_loop;
pub mod events;
pub mod executor;
pub mod fence;
pub mod finalizer;
pub mod gc;
pub mod identity;
mod intake;
pub mod leader;
pub mod metrics;
pub mod metrics_cilium;
pub mod nodes;
mod pass;
pub mod queue;
pub mod readonly;
pub mod refresher;
pub mod schedule;
pub mod settings;
pub mod shadow;
mod shared;
pub mod sink;
pub mod sink_layer;
pub mod source;
mod start;
pub mod status;
pub mod stored;
mod tasks;
pub mod type_limits;

#[cfg(test)]
mod stand_in;
