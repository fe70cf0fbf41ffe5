//! `eni-operator status` in the scenarios: read from the running operator's metrics listener
//! the way a user would (the binary's `status --output json`), and check that every waiting
//! node says why and when it is retried.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Result, ensure};
use eni_operator::reconcile::status::WaitReason;
use eni_operator::reconcile::status::page::Page;

use super::Suite;

/// (node, reason) pairs `status` showed.
pub(super) type Seen = BTreeSet<(String, WaitReason)>;

/// Waiting nodes of `page` that do not say why or when they are retried.
pub(super) fn unexplained(page: &Page) -> Vec<String> {
    page.nodes
        .iter()
        .filter_map(|(name, n)| {
            let w = n.waiting.as_ref()?;
            (w.detail.trim().is_empty() || w.retry_at.is_none()).then(|| format!("{name}: {w:?}"))
        })
        .collect()
}

impl Suite {
    /// The status page of the running operator that serves nodes (`None`: in-cluster mode, or
    /// no operator lists a node yet).
    pub(super) async fn status_page(&self) -> Result<Option<Page>> {
        if !self.ops.is_local() {
            return Ok(None);
        }
        for addr in self.ops.metrics_addrs() {
            // A standby answers 404: it has no page.
            if let Ok(page) = self.ops.run_status(&addr).await
                && page.totals.nodes > 0
            {
                return Ok(Some(page));
            }
        }
        Ok(None)
    }

    /// [`Suite::wait_served`], reading `status` every 300 ms meanwhile: the waits it showed.
    /// Fails when a waiting node was shown without a reason's detail or a retry time.
    pub(super) async fn wait_served_reading_status(&self, idxs: &[usize]) -> Result<Seen> {
        let seen = Mutex::new(Seen::new());
        let bad = Mutex::new(Vec::<String>::new());
        let names: BTreeSet<String> = idxs.iter().map(|&i| self.nodes[i].name.clone()).collect();
        let read = async {
            loop {
                if let Ok(Some(page)) = self.status_page().await {
                    bad.lock().expect("bad").extend(unexplained(&page));
                    let mut s = seen.lock().expect("seen");
                    for (name, n) in &page.nodes {
                        if let Some(w) = n.waiting.as_ref().filter(|_| names.contains(name)) {
                            s.insert((name.clone(), w.reason));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        };
        tokio::select! {
            r = self.wait_served(idxs, self.cfg.timeout) => r?,
            () = read => unreachable!("reads until the nodes are served"),
        }
        let bad = bad.into_inner().expect("bad");
        ensure!(bad.is_empty(), "status showed unexplained waits: {bad:?}");
        Ok(seen.into_inner().expect("seen"))
    }

    /// `status` showed a node waiting for `reason` (in local mode; NOT RUN in-cluster).
    pub(super) fn assert_status_showed(&self, seen: &Seen, reason: WaitReason) -> Result<()> {
        if !self.ops.is_local() {
            println!("     status: NOT RUN (the operator runs in the cluster)");
            return Ok(());
        }
        ensure!(
            seen.iter().any(|(_, r)| *r == reason),
            "eni-operator status never showed a node waiting {:?}; it showed {seen:?}",
            reason.as_str()
        );
        println!("     status showed: {seen:?}");
        Ok(())
    }
}
