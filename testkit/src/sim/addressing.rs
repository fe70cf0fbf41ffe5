//! A subnet's IPv4 address space as EC2 manages it: the first four addresses and the last are
//! reserved, every address is held by at most one ENI, and a /28 prefix needs an aligned block
//! of 16 free, unreserved addresses (so a fragmented subnet can have free addresses and no
//! room for a prefix). Allocation is deterministic: the lowest free address or block first.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use eni_operator::ec2::model::PREFIX_SIZE;

/// Addresses AWS reserves at the start of every subnet (network, router, DNS, future use).
const RESERVED_AT_START: u32 = 4;

#[derive(Clone, Debug)]
pub(crate) struct AddressPool {
    cidr: Ipv4Net,
    /// `used[i]`: offset `i` from the network address is held by an ENI.
    used: Vec<bool>,
    free: u32,
    /// No offset below this one is free: allocation scans start here.
    lowest: u32,
}

impl AddressPool {
    pub(crate) fn new(cidr: Ipv4Net) -> Self {
        let cidr = cidr.trunc();
        let size = 1u32 << (32 - u32::from(cidr.prefix_len()));
        let reserved = (RESERVED_AT_START + 1).min(size);
        Self {
            cidr,
            used: vec![false; size as usize],
            free: size - reserved,
            lowest: 0,
        }
    }

    fn size(&self) -> u32 {
        self.used.len() as u32
    }

    fn is_reserved(&self, offset: u32) -> bool {
        offset < RESERVED_AT_START || offset + 1 == self.size()
    }

    fn offset(&self, ip: Ipv4Addr) -> Option<u32> {
        self.cidr
            .contains(&ip)
            .then(|| u32::from(ip) - u32::from(self.cidr.network()))
    }

    fn addr(&self, offset: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.cidr.network()) + offset)
    }

    fn is_free(&self, offset: u32) -> bool {
        !self.is_reserved(offset) && !self.used[offset as usize]
    }

    /// Free single addresses: `AvailableIpAddressCount`.
    pub(crate) fn available(&self) -> u32 {
        self.free
    }

    /// Start offsets of the aligned /28 blocks that are entirely free, lowest first.
    pub(crate) fn free_blocks(&self) -> impl Iterator<Item = u32> + '_ {
        (self.lowest / PREFIX_SIZE..self.size() / PREFIX_SIZE)
            .map(|b| b * PREFIX_SIZE)
            .filter(|&start| (start..start + PREFIX_SIZE).all(|o| self.is_free(o)))
    }

    /// `n` single addresses, lowest first; all or nothing.
    pub(crate) fn take_ips(&mut self, n: u32) -> Option<Vec<Ipv4Addr>> {
        if n > self.free {
            return None;
        }
        let offsets: Vec<u32> = (self.lowest..self.size())
            .filter(|&o| self.is_free(o))
            .take(n as usize)
            .collect();
        for &o in &offsets {
            self.used[o as usize] = true;
        }
        if let Some(&last) = offsets.last() {
            self.lowest = last + 1;
        }
        self.free -= n;
        Some(offsets.into_iter().map(|o| self.addr(o)).collect())
    }

    /// `n` aligned /28 prefixes, lowest first; all or nothing.
    pub(crate) fn take_prefixes(&mut self, n: u32) -> Option<Vec<Ipv4Net>> {
        let taken: Vec<u32> = self.free_blocks().take(n as usize).collect();
        if (taken.len() as u32) < n {
            return None;
        }
        for &start in &taken {
            for o in start..start + PREFIX_SIZE {
                self.used[o as usize] = true;
            }
        }
        self.free -= n * PREFIX_SIZE;
        Some(
            taken
                .into_iter()
                .map(|start| Ipv4Net::new(self.addr(start), 28).expect("/28 is a valid length"))
                .collect(),
        )
    }

    /// Return an address taken earlier.
    pub(crate) fn release_ip(&mut self, ip: Ipv4Addr) {
        if let Some(o) = self.offset(ip)
            && !self.is_reserved(o)
            && self.used[o as usize]
        {
            self.used[o as usize] = false;
            self.free += 1;
            self.lowest = self.lowest.min(o);
        }
    }

    pub(crate) fn release_prefix(&mut self, prefix: Ipv4Net) {
        for ip in eni_operator::ec2::model::prefix_addresses(prefix) {
            self.release_ip(ip);
        }
    }

    /// Addresses currently held (for invariant checks).
    pub(crate) fn held(&self) -> u32 {
        self.used.iter().filter(|&&u| u).count() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn reserves_first_four_and_last_address() {
        let mut pool = AddressPool::new(net("10.0.32.0/28"));
        assert_eq!(pool.available(), 11);
        let ips = pool.take_ips(11).unwrap();
        assert_eq!(ips.first(), Some(&"10.0.32.4".parse().unwrap()));
        assert_eq!(ips.last(), Some(&"10.0.32.14".parse().unwrap()));
        assert_eq!(pool.available(), 0);
        assert!(pool.take_ips(1).is_none());
    }

    #[test]
    fn prefixes_are_aligned_and_skip_reserved_blocks() {
        let mut pool = AddressPool::new(net("10.0.0.0/26"));
        // Blocks 0 and 3 contain reserved addresses: only 2 prefixes fit.
        assert_eq!(pool.free_blocks().collect::<Vec<_>>(), vec![16, 32]);
        let p = pool.take_prefixes(2).unwrap();
        assert_eq!(p, vec![net("10.0.0.16/28"), net("10.0.0.32/28")]);
        assert_eq!(pool.available(), 59 - 32);
        assert!(pool.take_prefixes(1).is_none());
        pool.release_prefix(p[0]);
        assert_eq!(pool.available(), 59 - 16);
        assert_eq!(pool.free_blocks().collect::<Vec<_>>(), vec![16]);
    }

    #[test]
    fn fragmentation_leaves_addresses_but_no_prefix() {
        let mut pool = AddressPool::new(net("10.0.0.0/26"));
        let all = pool.take_ips(59).unwrap();
        // Free one address in each of the two unreserved blocks.
        pool.release_ip(all[12]);
        pool.release_ip(all[28]);
        assert_eq!(pool.available(), 2);
        assert!(pool.take_prefixes(1).is_none());
        assert_eq!(pool.take_ips(2).unwrap().len(), 2);
    }

    #[test]
    fn released_addresses_are_reused_lowest_first() {
        let mut pool = AddressPool::new(net("10.0.0.0/24"));
        let a = pool.take_ips(40).unwrap();
        pool.release_ip(a[3]);
        pool.release_ip(a[1]);
        assert_eq!(
            pool.take_ips(3).unwrap(),
            vec![a[1], a[3], "10.0.0.44".parse().unwrap()]
        );
        // Blocks 16 and 32 are partly used; the first free /28 is at .48.
        assert_eq!(pool.take_prefixes(1).unwrap(), vec![net("10.0.0.48/28")]);
        pool.release_ip(a[0]);
        assert_eq!(pool.take_ips(1).unwrap(), vec![a[0]]);
    }

    #[test]
    fn all_or_nothing() {
        let mut pool = AddressPool::new(net("10.0.32.0/28"));
        assert!(pool.take_ips(12).is_none());
        assert_eq!(pool.available(), 11);
        assert_eq!(pool.held(), 0);
    }
}
