//! A CiliumNode as the core keeps it between passes: serialised. The core holds one per node for
//! the life of the process, and a parsed CiliumNode costs about four times its JSON (B-tree
//! nodes sized for eleven entries, one heap string per address): 17 KB against 4 KB for a node
//! with four ENIs, so 5,000 nodes would hold 85 MB instead of 21 MB. A pass parses its node once.

use std::sync::Arc;

use crate::crd::CiliumNode;
use crate::ipam::confirmed::Confirmed;
use crate::ipam::handover::Writers;

/// A serialised CiliumNode plus the few facts the run loop reads without parsing it.
#[derive(Clone, Debug)]
pub struct StoredNode {
    json: Arc<[u8]>,
    instance_id: String,
    /// `metadata.uid`: a new object under the same name has a new one.
    uid: Option<String>,
    deleting: bool,
    pool_empty: bool,
    /// Who wrote the allocation fields, from the managedFields we drop (the handover guard).
    writers: Arc<Writers>,
    /// What the object proves we served it as, from the same managedFields.
    confirmed: Arc<Confirmed>,
}

impl StoredNode {
    /// Keep `node`, minus `metadata.managedFields` (never read by the operator; kilobytes per
    /// object on a real API server).
    pub fn new(node: &CiliumNode) -> Self {
        let json = if node.metadata.managed_fields.is_some() {
            let mut slim = node.clone();
            slim.metadata.managed_fields = None;
            serde_json::to_vec(&slim)
        } else {
            serde_json::to_vec(node)
        }
        .expect("a CiliumNode serialises to JSON");
        let mut confirmed = Confirmed::of(&node.metadata);
        // Planted defect (dst-mutants): the instance the object names counts as confirmed.
        if crate::mutants::active("trust-named-instance") {
            confirmed.instance = Some(node.spec.instance_id.clone());
        }
        Self {
            json: json.into(),
            instance_id: node.spec.instance_id.clone(),
            uid: node.metadata.uid.clone(),
            deleting: node.metadata.deletion_timestamp.is_some(),
            pool_empty: node.spec.ipam.pool.is_empty(),
            writers: Arc::new(Writers::of(&node.metadata)),
            confirmed: Arc::new(confirmed),
        }
    }

    /// For a copy of the node made here (it has no `managedFields`): what the object proved,
    /// and who wrote it, stay what `earlier`, the same object, showed.
    pub fn keep_proof_of(&mut self, node: &CiliumNode, earlier: Option<&StoredNode>) {
        if node.metadata.managed_fields.is_none()
            && let Some(e) = earlier.filter(|e| e.uid == self.uid)
        {
            self.confirmed = e.confirmed.clone();
            self.writers = e.writers.clone();
        }
    }

    /// The node, parsed. It was serialised from the same type, so parsing cannot fail.
    pub fn node(&self) -> CiliumNode {
        serde_json::from_slice(&self.json).expect("a stored CiliumNode parses")
    }

    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// `metadata.uid` (`None` when the object had none, as in some tests).
    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    /// Marked for deletion.
    pub fn deleting(&self) -> bool {
        self.deleting
    }

    /// Who wrote the allocation fields (from `metadata.managedFields`).
    pub fn writers(&self) -> &Writers {
        &self.writers
    }

    /// The instance and finalizer we put on the object (from `metadata.managedFields`).
    pub fn confirmed(&self) -> &Confirmed {
        &self.confirmed
    }

    /// `spec.ipam.pool` is empty.
    pub fn pool_empty(&self) -> bool {
        self.pool_empty
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn fixtures() -> Vec<CiliumNode> {
        [
            "ciliumnode-multipool-prefix.json",
            "ciliumnode-seed-pr45154.json",
        ]
        .iter()
        .filter_map(|f| {
            let path = format!("{}/tests/fixtures/{f}", env!("CARGO_MANIFEST_DIR"));
            std::fs::read_to_string(path).ok()
        })
        .map(|s| serde_json::from_str(&s).expect("fixture parses"))
        .collect()
    }

    #[test]
    fn a_stored_node_comes_back_equal_without_managed_fields() {
        let nodes = fixtures();
        assert_eq!(nodes.len(), 2, "fixtures found");
        for mut node in nodes {
            node.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
                manager: Some("cilium-agent".into()),
                ..Default::default()
            }]);
            let stored = StoredNode::new(&node);
            node.metadata.managed_fields = None;
            let back = stored.node();
            assert_eq!(back.spec, node.spec);
            assert_eq!(back.status, node.status);
            assert_eq!(back.metadata, node.metadata);
            assert_eq!(stored.instance_id(), node.spec.instance_id);
            assert_eq!(stored.pool_empty(), node.spec.ipam.pool.is_empty());
            assert!(!stored.deleting());
        }
    }
}
