//! Seeding that answers an error instead of panicking, for callers that take their input from
//! outside (ec2-sim's `CreateSubnet`, `RunInstances`, ...). Each check and change happens under
//! one lock, so concurrent requests cannot race past a check. Error codes are AWS's for the same
//! mistakes (EC2 API reference, "Error codes for the Amazon EC2 API").

use ipnet::Ipv4Net;

use super::Simulator;
use super::addressing::AddressPool;
use super::state::SubnetRec;
use eni_operator::ec2::model::*;

/// A refused seeding request: AWS's error code and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedError {
    pub code: &'static str,
    pub message: String,
}

fn refuse<T>(code: &'static str, message: impl Into<String>) -> Result<T, SeedError> {
    Err(SeedError {
        code,
        message: message.into(),
    })
}

fn vpc_not_found(vpc_id: &str) -> SeedError {
    SeedError {
        code: "InvalidVpcID.NotFound",
        message: format!("The vpc ID '{vpc_id}' does not exist"),
    }
}

/// The opaque `NextToken` that resumes a describe after the item whose sort key (its ID) is
/// `last_key`: a server honouring a smaller `MaxResults` than the simulator's page size cuts a
/// page short and hands this out.
pub fn resume_token(last_key: &str) -> String {
    super::state::encode_token(last_key)
}

impl Simulator {
    /// `AssociateVpcCidrBlock`: one more IPv4 block for the VPC.
    pub fn associate_vpc_cidr(&self, vpc_id: &str, cidr: Ipv4Net) -> Result<(), SeedError> {
        let mut inner = self.lock();
        let vpc = inner
            .state
            .vpcs
            .get_mut(vpc_id)
            .ok_or_else(|| vpc_not_found(vpc_id))?;
        let blocks = std::iter::once(&vpc.primary_cidr).chain(&vpc.secondary_cidrs);
        if blocks
            .clone()
            .any(|b| b.contains(&cidr) || cidr.contains(b))
        {
            return refuse(
                "InvalidVpc.Range",
                format!("The CIDR '{cidr}' overlaps a block of {vpc_id}"),
            );
        }
        vpc.secondary_cidrs.push(cidr.trunc());
        Ok(())
    }

    /// [`Simulator::add_subnet`], refusing what AWS refuses.
    pub fn try_add_subnet(
        &self,
        vpc_id: &str,
        zone: &str,
        cidr: Ipv4Net,
        tags: Tags,
    ) -> Result<String, SeedError> {
        let mut inner = self.lock();
        let st = &mut inner.state;
        let vpc = st.vpcs.get(vpc_id).ok_or_else(|| vpc_not_found(vpc_id))?;
        if !std::iter::once(&vpc.primary_cidr)
            .chain(&vpc.secondary_cidrs)
            .any(|b| b.contains(&cidr))
        {
            return refuse(
                "InvalidSubnet.Range",
                format!("The CIDR '{cidr}' is invalid: outside the VPC"),
            );
        }
        if cidr.prefix_len() > 28 {
            return refuse(
                "InvalidSubnet.Range",
                format!("The CIDR '{cidr}' is invalid: EC2's smallest subnet is a /28"),
            );
        }
        if st
            .subnets
            .values()
            .any(|s| s.subnet.cidr.contains(&cidr) || cidr.contains(&s.subnet.cidr))
        {
            return refuse(
                "InvalidSubnet.Conflict",
                format!("The CIDR '{cidr}' conflicts with another subnet"),
            );
        }
        let id = st.new_id("subnet");
        let pool = AddressPool::new(cidr);
        st.subnets.insert(
            id.clone(),
            SubnetRec {
                subnet: Subnet {
                    id: id.clone(),
                    vpc_id: vpc_id.to_owned(),
                    availability_zone: zone.to_owned(),
                    cidr: cidr.trunc(),
                    available_addresses: pool.available(),
                    tags,
                },
                pool,
            },
        );
        Ok(id)
    }

    /// [`Simulator::add_security_group`], refusing an unknown VPC.
    pub fn try_add_security_group(&self, vpc_id: &str, tags: Tags) -> Result<String, SeedError> {
        let mut inner = self.lock();
        if !inner.state.vpcs.contains_key(vpc_id) {
            return Err(vpc_not_found(vpc_id));
        }
        let group = |id| SecurityGroup {
            id,
            vpc_id: vpc_id.to_owned(),
            tags,
        };
        Ok(inner
            .state
            .insert_new("sg", |s| &mut s.security_groups, group))
    }

    /// [`Simulator::run_instance`] with the instance's tags, refusing an unknown type, subnet or
    /// group and a subnet without a free address for the primary ENI.
    pub fn try_run_instance(
        &self,
        instance_type: &str,
        subnet_id: &str,
        groups: &[String],
        tags: Tags,
    ) -> Result<Instance, SeedError> {
        self.try_run_instance_with_efas(instance_type, subnet_id, groups, tags, &[])
    }

    /// `RunInstances` with EFA interfaces beside the primary (p4d, p5, trn: one per network
    /// card, as AWS's EFA guide launches them). The EFAs are made first, so their IDs sort
    /// before the primary's: EC2 lists ENIs by ID, not by card, and nothing may take the first
    /// ENI at a device index 0 for the primary.
    pub fn try_run_instance_with_efas(
        &self,
        instance_type: &str,
        subnet_id: &str,
        groups: &[String],
        tags: Tags,
        efas: &[Efa],
    ) -> Result<Instance, SeedError> {
        let mut inner = self.lock();
        let st = &mut inner.state;
        if !st.types.contains_key(instance_type) {
            return refuse(
                "InvalidParameterValue",
                format!("Invalid value '{instance_type}' for InstanceType."),
            );
        }
        let Some(subnet) = st.subnets.get(subnet_id) else {
            return refuse(
                "InvalidSubnetID.NotFound",
                format!("The subnet ID '{subnet_id}' does not exist"),
            );
        };
        if subnet.pool.available() == 0 {
            return refuse(
                "InsufficientFreeAddressesInSubnet",
                format!("The specified subnet {subnet_id} does not have enough free addresses"),
            );
        }
        if let Some(g) = groups.iter().find(|g| !st.security_groups.contains_key(*g)) {
            return refuse(
                "InvalidGroup.NotFound",
                format!("The security group '{g}' does not exist"),
            );
        }
        let subnet = subnet.subnet.clone();
        let id = st.new_id("i");
        let instance = Instance {
            id: id.clone(),
            instance_type: instance_type.to_owned(),
            state: InstanceState::Running,
            availability_zone: subnet.availability_zone.clone(),
            vpc_id: subnet.vpc_id.clone(),
            subnet_id: subnet_id.to_owned(),
            tags,
        };
        st.instances.insert(id.clone(), instance.clone());
        for efa in efas {
            if let Err(e) = st.add_efa(&id, subnet_id, efa) {
                st.instances.remove(&id);
                return refuse("InvalidParameterValue", e.message);
            }
        }
        let primary = st
            .create_network_interface(&CreateEniRequest {
                subnet_id: subnet_id.to_owned(),
                security_groups: groups.to_vec(),
                description: "Primary network interface".to_owned(),
                tags: Tags::new(),
                addresses: AddressRequest::Ips(0),
                client_token: String::new(),
            })
            .and_then(|eni| {
                let attachment = st.attach_network_interface(&eni.id, &id, 0)?;
                st.set_delete_on_termination(&eni.id, &attachment, true)
            });
        if let Err(e) = primary {
            st.instances.remove(&id);
            return refuse("InternalError", format!("primary ENI: {e}"));
        }
        Ok(instance)
    }

    /// An instance as `DescribeInstances` would show it, without going through the API.
    pub fn instance(&self, instance_id: &str) -> Option<Instance> {
        self.peek().state.instances.get(instance_id).cloned()
    }

    /// Every instance's ID, smallest first (terminated ones included).
    pub fn instance_ids(&self) -> Vec<String> {
        self.peek().state.instances.keys().cloned().collect()
    }

    /// A subnet as `DescribeSubnets` would show it, without going through the API.
    pub fn subnet(&self, subnet_id: &str) -> Option<Subnet> {
        let inner = self.peek();
        let rec = inner.state.subnets.get(subnet_id)?;
        Some(Subnet {
            available_addresses: rec.pool.available(),
            ..rec.subnet.clone()
        })
    }
}

/// An EFA interface launched with an instance. An `efa` interface is an ENA interface with the
/// EFA device: it has an IPv4 address; an `efa-only` one has none (EC2 User Guide, "Elastic
/// Fabric Adapter", "EFA-only interfaces"). Neither serves pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Efa {
    pub card: u32,
    pub device_index: u32,
    pub efa_only: bool,
    pub groups: Vec<String>,
}

impl super::state::State {
    /// Create `efa` in the instance's subnet and attach it where it says.
    pub(crate) fn add_efa(
        &mut self,
        instance_id: &str,
        subnet_id: &str,
        efa: &Efa,
    ) -> eni_operator::ec2::Result<()> {
        let eni = self.create_network_interface(&CreateEniRequest {
            subnet_id: subnet_id.to_owned(),
            security_groups: efa.groups.clone(),
            description: "EFA".to_owned(),
            tags: Tags::new(),
            addresses: AddressRequest::Ips(0),
            client_token: String::new(),
        })?;
        let rec = self.enis.get_mut(&eni.id).expect("just created");
        if efa.efa_only {
            rec.eni.interface_type = InterfaceType::EfaOnly;
            let ip = std::mem::replace(&mut rec.eni.primary_ip, std::net::Ipv4Addr::UNSPECIFIED);
            if let Some(sn) = self.subnets.get_mut(subnet_id) {
                sn.pool.release_ip(ip);
            }
        } else {
            rec.eni.interface_type = InterfaceType::Efa;
        }
        let attachment = self.attach_on_card(&eni.id, instance_id, efa.device_index, efa.card)?;
        self.set_delete_on_termination(&eni.id, &attachment, true)
    }
}
