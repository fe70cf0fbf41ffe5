//! What `/debug/nodes` serves (and `eni-operator status` reads back): the page and its rows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Figures, WaitReason, Would};

/// Why a node waits and until when (as served).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Wait {
    pub reason: WaitReason,
    pub detail: String,
    /// RFC 3339; `None`: at the node's next input or the next rescan.
    pub retry_at: Option<String>,
    pub retry_in_seconds: Option<f64>,
}

/// A message and when it happened (as served).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stamped<T> {
    #[serde(flatten)]
    pub what: T,
    pub at: String,
}

/// A node's status as served at `/debug/nodes`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    #[serde(flatten)]
    pub figures: Figures,
    /// A pass over the node runs now.
    pub running: bool,
    pub last_pass: Option<String>,
    /// The last EC2 action carried out for the node.
    pub last_action: Option<Stamped<Would>>,
    /// The action the last pass planned (carried out, or waiting).
    pub next: Would,
    pub waiting: Option<Wait>,
    pub last_error: Option<Stamped<Message>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    pub nodes: usize,
    pub nodes_waiting: usize,
    pub nodes_with_errors: usize,
    pub waiting: BTreeMap<WaitReason, usize>,
}

/// `/debug/nodes`: the shape of `/debug/shadow` (totals, then nodes by name).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Page {
    pub totals: Totals,
    pub nodes: BTreeMap<String, NodeStatus>,
}
