//! The agent models as a library, so the deterministic simulation (`dst`) plays the same
//! multi-pool agent as the end-to-end suite instead of a third copy.

pub mod agent;
