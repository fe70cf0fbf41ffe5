pub mod child;
pub mod moto;
pub mod settings;

use std::net::Ipv4Addr;
use std::sync::{Arc, RwLock};

use eni_operator::cache::Ec2Cache;
use eni_operator::ec2::NetworkInterface;

/// A cache of `cluster` that has seen `instance` with `enis`, as the executor's view.
pub fn cache_with(
    cluster: &str,
    instance: &str,
    enis: Vec<NetworkInterface>,
) -> Arc<RwLock<Ec2Cache>> {
    let cache = Arc::new(RwLock::new(Ec2Cache::for_cluster(cluster)));
    cache.write().unwrap().apply_instances(
        &[instance.to_string()],
        enis,
        tokio::time::Instant::now().into_std(),
    );
    cache
}

/// The secondary addresses the cache holds for an ENI it knows.
pub fn cached_ips(cache: &RwLock<Ec2Cache>, eni: &str) -> Vec<Ipv4Addr> {
    cache
        .read()
        .unwrap()
        .eni(eni)
        .unwrap()
        .secondary_ips
        .clone()
}
