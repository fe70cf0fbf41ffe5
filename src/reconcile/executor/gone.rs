//! The executor's actions outside the engine's [`crate::ipam::Action`]: a gone node's ENIs
//! given back (the finalizer), and the static IP associated or taken off. The pass reads the
//! facts and decides; these only call EC2 and keep the cache true to what they did.

use std::net::Ipv4Addr;

use tracing::debug;

use crate::clock::now;
use crate::ec2::{Ec2, Ec2Error};
use crate::reconcile::finalizer::{releasable, release_instance_enis};
use crate::reconcile::metrics::DELETED_NODE_GONE;

use super::Executor;

impl<E: Ec2> Executor<E> {
    /// Detach and delete the instance's ENIs of ours; how many were deleted.
    pub async fn give_back_enis(&self, cluster: &str, instance: &str) -> Result<usize, Ec2Error> {
        // Describes lag behind these detaches (and a timeout can hide one that took effect): if
        // the Node comes back, the cache must not hand its new CiliumNode a lagging listing's
        // ENIs.
        let mark = || {
            let mut cache = self.cache();
            cache.releasing(instance, now(), |e| releasable(e, cluster, instance));
        };
        mark();
        let released = release_instance_enis(&*self.ec2, cluster, instance).await;
        mark();
        let n = released?;
        self.metrics.eni_deleted(DELETED_NODE_GONE, n as u64);
        Ok(n)
    }

    /// Associate the first of `candidates` (allocation ID, public IP) that is still free with
    /// the ENI's `private_ip`; `None`: all were taken since the describe.
    pub async fn associate_static(
        &self,
        candidates: &[(String, Ipv4Addr)],
        eni_id: &str,
        private_ip: Ipv4Addr,
    ) -> Result<Option<Ipv4Addr>, Ec2Error> {
        for (allocation_id, public_ip) in candidates {
            match self
                .ec2
                .associate_address(allocation_id, eni_id, private_ip)
                .await
            {
                Ok(_) => return Ok(Some(*public_ip)),
                // Planted defect (dst-mutants): a lost race taken for a win.
                Err(e)
                    if e.is_already_associated()
                        && crate::mutants::active("static-ip-race-won") =>
                {
                    return Ok(Some(*public_ip));
                }
                // Another node (or another tool) took it since the describe: the next one.
                Err(e) if e.is_already_associated() => {
                    debug!(allocation_id, "Elastic IP taken meanwhile; trying the next");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Take these associations off (never release the addresses: they are the user's); how
    /// many went. One gone already (a repeat whose first answer was lost, or the instance
    /// ended) counts as done.
    pub async fn disassociate_static(&self, associations: &[String]) -> Result<usize, Ec2Error> {
        let mut n = 0;
        for assoc in associations {
            match self.ec2.disassociate_address(assoc).await {
                Ok(()) => n += 1,
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }
}
