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
            .cloned()
            .collect()
    }

    pub(crate) fn associate_address(
        &mut self,
        allocation_id: &str,
        eni_id: &str,
        private_ip: Ipv4Addr,
    ) -> Result<String> {
        let op = Operation::AssociateAddress;
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
                other.association_id = None;
                other.network_interface_id = None;
                other.private_ip = None;
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
        address.association_id = None;
        address.network_interface_id = None;
        address.private_ip = None;
        Ok(())
    }
}
