//! Demand: agent generation, available/used/needed/excess.

/// Which Cilium agent generation serves the node (C6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Generation {
    #[default]
    Classic,
    MultiPool,
}

/// The node's demand figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    pub generation: Generation,
    pub available: i64,
    pub used: i64,
    pub needed: i64,
    pub excess: i64,
}
