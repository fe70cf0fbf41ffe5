//! The simulator's Elastic IP calls and seeding (rules: `state/addresses.rs`).

use std::net::Ipv4Addr;

use eni_operator::ec2::Result;
use eni_operator::ec2::model::{Address, Operation, Tags};

use super::Simulator;

impl Simulator {
    /// An Elastic IP the user allocated (AllocateAddress) with these tags; its allocation ID.
    pub fn add_address(&self, public_ip: Ipv4Addr, tags: Tags) -> String {
        self.lock().state.add_address(public_ip, tags)
    }

    /// Every Elastic IP, as EC2 holds it now (for checks: no call is metered).
    pub fn addresses(&self) -> Vec<Address> {
        self.peek().state.describe_addresses(&Tags::new())
    }

    pub(super) async fn describe_addresses_call(&self, tags: &Tags) -> Result<Vec<Address>> {
        self.call(Operation::DescribeAddresses, |s, _| {
            Ok(s.describe_addresses(tags))
        })
        .await
    }

    pub(super) async fn associate_address_call(
        &self,
        allocation_id: &str,
        eni_id: &str,
        private_ip: Ipv4Addr,
    ) -> Result<String> {
        self.call(Operation::AssociateAddress, |s, _| {
            s.associate_address(allocation_id, eni_id, private_ip)
        })
        .await
    }

    pub(super) async fn disassociate_address_call(&self, association_id: &str) -> Result<()> {
        self.call(Operation::DisassociateAddress, |s, _| {
            s.disassociate_address(association_id)
        })
        .await
    }
}
