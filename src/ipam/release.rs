//! Release bookkeeping per node (classic handshake, multi-pool CIDR marks).

/// In-memory release state of one node; lost on restart (a handshake then restarts).
#[derive(Clone, Debug, Default)]
pub struct NodeMemory {}
