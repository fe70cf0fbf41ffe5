//! Elastic IPs (static IPs): DescribeAddresses, AssociateAddress, DisassociateAddress, as AWS
//! documents them in the EC2 API reference:
//! * an association binds one address to one (ENI, private address); with
//!   `AllowReassociation` false, an address that is associated already is refused with
//!   `Resource.AlreadyAssociated`;
//! * the private address must be one of the ENI's (else `InvalidParameterValue`);
//! * a private address that already has an Elastic IP gets the new one instead (the old one is
//!   disassociated): EC2 does not stop a second address from replacing the first, so "one EIP
//!   per node" is the operator's rule, checked by the simulation, not EC2's.
//! * DescribeAddresses is not paginated; `tag:` filters must all match.
//! * an association ends with its ENI (deleted, or with its terminated instance): kept here
//!   until the next call on the addresses, shown and treated as none meanwhile.

use std::net::Ipv4Addr;

use eni_operator::ec2::Result;
use eni_operator::ec2::model::{Address, Operation, Tags};

use super::{State, aws_err, tags_match};

impl State {
    pub(crate) fn add_address(&mut self, public_ip: Ipv4Addr, tags: Tags) -> String {
        let id = self.new_id("eipalloc");
        self.addresses.insert(
            id.clone(),
            Address {
                allocation_id: id.clone(),
                public_ip,
                association_id: None,
                network_interface_id: None,
                private_ip: None,
                tags,
            },
        );
        id
    }

    pub(crate) fn describe_addresses(&self, tags: &Tags) -> Vec<Address> {
        self.addresses
            .values()
            .filter(|a| tags_match(&a.tags, tags))
            .map(|a| {
                let mut a = a.clone();
                if self.stale(&a) {
                    clear(&mut a);
                }
                a
            })
            .collect()
    }

    /// Associated with an ENI that is gone.
    fn stale(&self, a: &Address) -> bool {
        a.network_interface_id
            .as_ref()
            .is_some_and(|e| !self.enis.contains_key(e))
    }

    fn drop_stale(&mut self) {
        let stale: Vec<String> = self
            .addresses
            .values()
            .filter(|a| self.stale(a))
            .map(|a| a.allocation_id.clone())
            .collect();
        for id in stale {
            if let Some(a) = self.addresses.get_mut(&id) {
                clear(a);
            }
        }
    }

    pub(crate) fn associate_address(
        &mut self,
        allocation_id: &str,
        eni_id: &str,
        private_ip: Ipv4Addr,
    ) -> Result<String> {
        let op = Operation::AssociateAddress;
        self.drop_stale();
        let Some(address) = self.addresses.get(allocation_id) else {
            return Err(aws_err(
                op,
                "InvalidAllocationID.NotFound",
                format!("The allocation ID '{allocation_id}' does not exist"),
            ));
        };
        if let Some(assoc) = &address.association_id {
            return Err(aws_err(
                op,
                "Resource.AlreadyAssociated",
                format!("resource {allocation_id} is already associated with associate-id {assoc}"),
            ));
        }
        let eni = &self.eni(op, eni_id)?.eni;
        if eni.primary_ip != private_ip && !eni.secondary_ips.contains(&private_ip) {
            return Err(aws_err(
                op,
                "InvalidParameterValue",
                format!("The private IP address {private_ip} is not assigned to {eni_id}"),
            ));
        }
        // The target's previous Elastic IP, if any, is replaced.
        for other in self.addresses.values_mut() {
            if other.network_interface_id.as_deref() == Some(eni_id)
                && other.private_ip == Some(private_ip)
            {
                clear(other);
            }
        }
        let assoc = self.new_id("eipassoc");
        let address = self
            .addresses
            .get_mut(allocation_id)
            .expect("checked above");
        address.association_id = Some(assoc.clone());
        address.network_interface_id = Some(eni_id.to_string());
        address.private_ip = Some(private_ip);
        Ok(assoc)
    }

    pub(crate) fn disassociate_address(&mut self, association_id: &str) -> Result<()> {
        self.drop_stale();
        let found = self
            .addresses
            .values_mut()
            .find(|a| a.association_id.as_deref() == Some(association_id));
        let Some(address) = found else {
            return Err(aws_err(
                Operation::DisassociateAddress,
                "InvalidAssociationID.NotFound",
                format!("The association ID '{association_id}' does not exist"),
            ));
        };
        clear(address);
        Ok(())
    }
}

fn clear(a: &mut Address) {
    a.association_id = None;
    a.network_interface_id = None;
    a.private_ip = None;
}
