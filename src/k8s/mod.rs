//! The Kubernetes side: the watches that feed the event loop ([`source`], their messages in
//! [`input`]), the writes that leave it ([`sink`]; [`readonly`] and [`fence`] wrap it), the
//! CiliumNode as kept between passes ([`stored`]), the Lease ([`leader`]) and what the handover
//! guard reads of Cilium's operator ([`cilium_lease`], [`cilium_version`]).
//! Nothing here knows the pass, the queue or the EC2 cache.

pub mod cilium_lease;
pub mod cilium_version;
pub mod fence;
pub mod input;
pub mod leader;
pub mod readonly;
pub mod sink;
pub mod sink_layer;
pub mod source;
pub mod stored;

#[cfg(test)]
mod stand_in;
