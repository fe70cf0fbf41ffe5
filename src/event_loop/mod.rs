//! The event loop: the allocation [`core`] takes [`NodeInput`](crate::k8s::input::NodeInput)s
//! through a channel ([`intake`]), runs one pass per node from the queue and the EC2 refreshes
//! the [`schedule`] asks for ([`run`], [`tasks`]), looks up the instance behind a Node's
//! InternalIP ([`owners`]), and holds the first listing of a leadership
//! back until the nodes are known ([`start`]). It writes through a
//! [`NodeSink`](crate::k8s::sink::NodeSink), so it runs without Kubernetes (tests, benchmark).

pub mod core;
mod intake;
mod owners;
mod run;
pub mod schedule;
mod start;
mod state;
mod tasks;
