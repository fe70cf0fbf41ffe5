//! Seeds the EC2 side through the real SDK against `EC2_ENDPOINT`, like a cloud would: a VPC
//! with a secondary CIDR, node and pod subnets in two AZs, security groups, and instances on
//! demand. Records what it made, and answers the suite's questions about ENIs.
//!
//! Pod subnets are large on purpose: emulators pick secondary IPs at random without a
//! subnet-wide uniqueness check (see docs/emulators.md), and big subnets make such
//! collisions rare; the suite still tells them apart from operator bugs.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_ec2::types::{
    DomainType, Filter, InstanceType, NetworkInterfaceStatus, ResourceType, Tag, TagSpecification,
};

/// Tag on everything the seed creates, with the run's id as value.
pub const RUN_TAG: &str = "eni-operator-e2e/run";
/// Tag selecting pod subnets and pod security groups (used as `subnet-tags` by nodes).
pub const POD_TAG: &str = "eni-operator-e2e/pods";
/// Ownership tags the operator puts on the ENIs it creates.
pub const OWNER_CLUSTER_TAG: &str = "eni-operator.io/cluster-name";
pub const OWNER_INSTANCE_TAG: &str = "eni-operator.io/instance-id";
/// Tag on the Elastic IPs the suite seeds for `static-ip` (value: the run's id); nodes ask for
/// it with `spec.ipam.static-ip-tags`.
pub const EIP_TAG: &str = "eni-operator-e2e/static-ip";

/// Connection settings for the EC2 endpoint.
#[derive(Clone, Debug)]
pub struct Ec2Target {
    pub endpoint: String,
    pub region: String,
}

/// Builds an SDK client for the endpoint; credentials come from the environment or are dummies
/// (emulators accept any).
pub async fn client(target: &Ec2Target) -> Client {
    let key = std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_else(|_| "test".into());
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|_| "test".into());
    let conf = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(target.region.clone()))
        .endpoint_url(&target.endpoint)
        .credentials_provider(Credentials::new(
            key,
            secret,
            None,
            None,
            "eni-operator-e2e",
        ))
        .timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .operation_timeout(Duration::from_secs(30))
                .build(),
        )
        .load()
        .await;
    Client::new(&conf)
}

/// A subnet made by the seed.
#[derive(Clone, Debug)]
pub struct Subnet {
    pub id: String,
    pub az: String,
    pub cidr: String,
    pub pods: bool,
}

/// An instance made by the seed, with the facts an agent reads from IMDS.
#[derive(Clone, Debug)]
pub struct Instance {
    pub id: String,
    pub instance_type: String,
    pub az: String,
    pub subnet_id: String,
}

/// The seeded world.
#[derive(Clone, Debug)]
pub struct World {
    pub run_id: String,
    pub vpc_id: String,
    pub zones: [String; 2],
    /// Per zone index: (node subnet, pod subnet).
    pub subnets: Vec<Subnet>,
    pub pod_security_group: String,
    pub other_security_group: String,
    pub image_id: String,
    pub instances: Vec<Instance>,
    /// `--cluster-name` of the operators under test: instances carry
    /// `kubernetes.io/cluster/<it>` as EKS and Karpenter tag them (the operator touches no
    /// instance without it). Empty: no such tag.
    pub cluster_name: String,
}

/// An ENI as EC2 reports it, reduced to what the assertions need.
#[derive(Clone, Debug, PartialEq)]
pub struct EniView {
    pub id: String,
    pub status: String,
    pub instance_id: Option<String>,
    pub device_index: Option<i32>,
    pub addresses: Vec<String>,
    pub prefixes: Vec<String>,
    pub tags: BTreeMap<String, String>,
}

fn tags(resource: ResourceType, pairs: &[(&str, &str)]) -> TagSpecification {
    let mut spec = TagSpecification::builder().resource_type(resource);
    for (k, v) in pairs {
        spec = spec.tags(Tag::builder().key(*k).value(*v).build());
    }
    spec.build()
}

fn filter(name: &str, value: &str) -> Filter {
    Filter::builder().name(name).values(value).build()
}

impl World {
    /// Creates the VPC, subnets and security groups.
    pub async fn seed(ec2: &Client, run_id: &str) -> Result<Self> {
        let run = [(RUN_TAG, run_id)];
        let zones_out = ec2
            .describe_availability_zones()
            .send()
            .await
            .context("DescribeAvailabilityZones")?;
        let mut zones: Vec<String> = zones_out
            .availability_zones()
            .iter()
            .filter_map(|z| z.zone_name().map(String::from))
            .collect();
        zones.sort();
        if zones.len() < 2 {
            return Err(anyhow!(
                "the EC2 endpoint offers {} availability zones, need 2",
                zones.len()
            ));
        }
        let vpc = ec2
            .create_vpc()
            .cidr_block("10.0.0.0/16")
            .tag_specifications(tags(
                ResourceType::Vpc,
                &[(RUN_TAG, run_id), ("Name", "eni-operator-e2e")],
            ))
            .send()
            .await
            .context("CreateVpc")?;
        let vpc_id = vpc
            .vpc()
            .and_then(|v| v.vpc_id())
            .context("CreateVpc: no id")?
            .to_string();
        ec2.associate_vpc_cidr_block()
            .vpc_id(&vpc_id)
            .cidr_block("100.64.0.0/16")
            .send()
            .await
            .context("AssociateVpcCidrBlock")?;

        let plan = [
            (0, "10.0.0.0/24", false),
            (0, "100.64.0.0/17", true),
            (1, "10.0.1.0/24", false),
            (1, "100.64.128.0/17", true),
        ];
        let mut subnets = Vec::new();
        for (zone, cidr, pods) in plan {
            let mut t: Vec<(&str, &str)> = run.to_vec();
            if pods {
                t.push((POD_TAG, "true"));
            }
            let out = ec2
                .create_subnet()
                .vpc_id(&vpc_id)
                .cidr_block(cidr)
                .availability_zone(&zones[zone])
                .tag_specifications(tags(ResourceType::Subnet, &t))
                .send()
                .await
                .with_context(|| format!("CreateSubnet {cidr}"))?;
            let id = out
                .subnet()
                .and_then(|s| s.subnet_id())
                .context("CreateSubnet: no id")?;
            subnets.push(Subnet {
                id: id.to_string(),
                az: zones[zone].clone(),
                cidr: cidr.to_string(),
                pods,
            });
        }

        let mut groups = Vec::new();
        for (name, pods) in [("e2e-pods", true), ("e2e-other", false)] {
            let mut t: Vec<(&str, &str)> = run.to_vec();
            if pods {
                t.push((POD_TAG, "true"));
            }
            let out = ec2
                .create_security_group()
                .vpc_id(&vpc_id)
                .group_name(format!("{name}-{run_id}"))
                .description("eni-operator e2e")
                .tag_specifications(tags(ResourceType::SecurityGroup, &t))
                .send()
                .await
                .with_context(|| format!("CreateSecurityGroup {name}"))?;
            groups.push(
                out.group_id()
                    .context("CreateSecurityGroup: no id")?
                    .to_string(),
            );
        }

        // Emulators preload images; any AMI ID is accepted otherwise.
        let image_id = ec2
            .describe_images()
            .send()
            .await
            .ok()
            .and_then(|o| {
                o.images()
                    .first()
                    .and_then(|i| i.image_id())
                    .map(String::from)
            })
            .unwrap_or_else(|| "ami-12c6146b".to_string());

        Ok(Self {
            run_id: run_id.to_string(),
            vpc_id,
            zones: [zones[0].clone(), zones[1].clone()],
            subnets,
            pod_security_group: groups[0].clone(),
            other_security_group: groups[1].clone(),
            image_id,
            instances: Vec::new(),
            cluster_name: String::new(),
        })
    }

    pub fn node_subnet(&self, zone: usize) -> &Subnet {
        self.subnets
            .iter()
            .filter(|s| !s.pods)
            .nth(zone)
            .expect("two node subnets")
    }

    pub fn pod_subnet(&self, zone: usize) -> &Subnet {
        self.subnets
            .iter()
            .filter(|s| s.pods)
            .nth(zone)
            .expect("two pod subnets")
    }

    /// Runs one instance of `instance_type` in zone `zone` (0 or 1) on its node subnet.
    pub async fn launch(
        &mut self,
        ec2: &Client,
        instance_type: &str,
        zone: usize,
    ) -> Result<Instance> {
        let subnet = self.node_subnet(zone).clone();
        let cluster_tag = format!("kubernetes.io/cluster/{}", self.cluster_name);
        let mut instance_tags = vec![(RUN_TAG, self.run_id.as_str())];
        if !self.cluster_name.is_empty() {
            instance_tags.push((cluster_tag.as_str(), "owned"));
        }
        let out = ec2
            .run_instances()
            .image_id(&self.image_id)
            .instance_type(InstanceType::from(instance_type))
            .min_count(1)
            .max_count(1)
            .subnet_id(&subnet.id)
            .security_group_ids(&self.other_security_group)
            .tag_specifications(tags(ResourceType::Instance, &instance_tags))
            .send()
            .await
            .with_context(|| format!("RunInstances {instance_type}"))?;
        let id = out
            .instances()
            .first()
            .and_then(|i| i.instance_id())
            .context("RunInstances: no instance")?
            .to_string();
        let inst = Instance {
            id,
            instance_type: instance_type.to_string(),
            az: subnet.az.clone(),
            subnet_id: subnet.id,
        };
        self.instances.push(inst.clone());
        Ok(inst)
    }

    /// Terminates every instance the seed launched (best effort: emulator state is disposable).
    pub async fn terminate_all(&mut self, ec2: &Client) {
        let ids: Vec<String> = self.instances.drain(..).map(|i| i.id).collect();
        if !ids.is_empty()
            && let Err(e) = ec2
                .terminate_instances()
                .set_instance_ids(Some(ids))
                .send()
                .await
        {
            tracing::warn!("TerminateInstances: {e}");
        }
    }
}

/// An Elastic IP as EC2 reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct EipView {
    pub allocation_id: String,
    pub public_ip: String,
    pub association_id: Option<String>,
    pub network_interface_id: Option<String>,
    pub private_ip: Option<String>,
}

/// Allocates a VPC Elastic IP tagged `EIP_TAG=<run>` (as a user does for Cilium's static IPs)
/// and given to the cluster (`OWNER_CLUSTER_TAG=<cluster>`, the operator's default
/// `--static-ip-required-tag`).
pub async fn allocate_eip(ec2: &Client, run_id: &str, cluster: &str) -> Result<EipView> {
    let out = ec2
        .allocate_address()
        .domain(DomainType::Vpc)
        .tag_specifications(tags(
            ResourceType::ElasticIp,
            &[
                (EIP_TAG, run_id),
                (RUN_TAG, run_id),
                (OWNER_CLUSTER_TAG, cluster),
            ],
        ))
        .send()
        .await
        .context("AllocateAddress")?;
    let id = out.allocation_id().context("AllocateAddress: no id")?;
    eips(ec2, run_id)
        .await?
        .into_iter()
        .find(|e| e.allocation_id == id)
        .with_context(|| format!("{id} not listed by DescribeAddresses with its tag"))
}

/// The Elastic IPs tagged `EIP_TAG=<run>`.
pub async fn eips(ec2: &Client, run_id: &str) -> Result<Vec<EipView>> {
    let out = ec2
        .describe_addresses()
        .filters(filter(&format!("tag:{EIP_TAG}"), run_id))
        .send()
        .await
        .context("DescribeAddresses")?;
    let mut v: Vec<EipView> = out
        .addresses()
        .iter()
        .map(|a| EipView {
            allocation_id: a.allocation_id().unwrap_or_default().to_string(),
            public_ip: a.public_ip().unwrap_or_default().to_string(),
            association_id: a.association_id().map(String::from),
            network_interface_id: a.network_interface_id().map(String::from),
            private_ip: a.private_ip_address().map(String::from),
        })
        .collect();
    v.sort_by(|a, b| a.allocation_id.cmp(&b.allocation_id));
    Ok(v)
}

/// The instance's primary ENI (device index 0) and its primary private address.
pub async fn primary_address(ec2: &Client, instance_id: &str) -> Result<(String, String)> {
    let out = ec2
        .describe_network_interfaces()
        .filters(filter("attachment.instance-id", instance_id))
        .send()
        .await
        .context("DescribeNetworkInterfaces")?;
    out.network_interfaces()
        .iter()
        .find(|n| n.attachment().and_then(|a| a.device_index()) == Some(0))
        .and_then(|n| {
            Some((
                n.network_interface_id()?.to_string(),
                n.private_ip_address()?.to_string(),
            ))
        })
        .with_context(|| format!("{instance_id} has no primary ENI"))
}

/// Creates and attaches (device index 1) an ENI with the operator's ownership tags on the pod
/// subnet of the instance's zone: used by `seed` to check the endpoint's answers.
pub async fn create_owned_eni(
    ec2: &Client,
    world: &World,
    inst: &Instance,
    cluster: &str,
    ips: i32,
) -> Result<String> {
    let subnet = world
        .subnets
        .iter()
        .find(|s| s.pods && s.az == inst.az)
        .context("no pod subnet in the instance's zone")?;
    let out = ec2
        .create_network_interface()
        .subnet_id(&subnet.id)
        .groups(&world.pod_security_group)
        .secondary_private_ip_address_count(ips)
        .tag_specifications(tags(
            ResourceType::NetworkInterface,
            &[(OWNER_CLUSTER_TAG, cluster), (OWNER_INSTANCE_TAG, &inst.id)],
        ))
        .send()
        .await
        .context("CreateNetworkInterface")?;
    let id = out
        .network_interface()
        .and_then(|n| n.network_interface_id())
        .context("CreateNetworkInterface: no id")?
        .to_string();
    ec2.attach_network_interface()
        .network_interface_id(&id)
        .instance_id(&inst.id)
        .device_index(1)
        .send()
        .await
        .context("AttachNetworkInterface")?;
    Ok(id)
}

/// Detaches (if attached) and deletes an ENI.
pub async fn delete_eni(ec2: &Client, id: &str) -> Result<()> {
    let out = ec2
        .describe_network_interfaces()
        .network_interface_ids(id)
        .send()
        .await
        .context("DescribeNetworkInterfaces")?;
    let attachment = out
        .network_interfaces()
        .first()
        .and_then(|n| n.attachment())
        .and_then(|a| a.attachment_id())
        .map(String::from);
    if let Some(att) = attachment {
        ec2.detach_network_interface()
            .attachment_id(att)
            .send()
            .await
            .context("DetachNetworkInterface")?;
    }
    ec2.delete_network_interface()
        .network_interface_id(id)
        .send()
        .await
        .context("DeleteNetworkInterface")?;
    Ok(())
}

/// Every ENI carrying our cluster's ownership tag.
pub async fn owned_enis(ec2: &Client, cluster: &str) -> Result<Vec<EniView>> {
    describe(
        ec2,
        vec![filter(&format!("tag:{OWNER_CLUSTER_TAG}"), cluster)],
    )
    .await
}

/// Every ENI attached to `instance_id`.
pub async fn instance_enis(ec2: &Client, instance_id: &str) -> Result<Vec<EniView>> {
    describe(ec2, vec![filter("attachment.instance-id", instance_id)]).await
}

/// Every ENI in the VPC (used to tell emulator duplicates from operator bugs).
pub async fn vpc_enis(ec2: &Client, vpc_id: &str) -> Result<Vec<EniView>> {
    describe(ec2, vec![filter("vpc-id", vpc_id)]).await
}

async fn describe(ec2: &Client, filters: Vec<Filter>) -> Result<Vec<EniView>> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = ec2
            .describe_network_interfaces()
            .set_filters(Some(filters.clone()))
            .set_next_token(token.clone())
            .send()
            .await
            .context("DescribeNetworkInterfaces")?;
        out.extend(page.network_interfaces().iter().map(view));
        token = page
            .next_token()
            .filter(|t| !t.is_empty())
            .map(String::from);
        if token.is_none() {
            break;
        }
    }
    Ok(out)
}

fn view(n: &aws_sdk_ec2::types::NetworkInterface) -> EniView {
    let primary = n.private_ip_address();
    EniView {
        id: n.network_interface_id().unwrap_or_default().to_string(),
        status: n
            .status()
            .map(NetworkInterfaceStatus::as_str)
            .unwrap_or_default()
            .to_string(),
        instance_id: n
            .attachment()
            .and_then(|a| a.instance_id())
            .map(String::from),
        device_index: n.attachment().and_then(|a| a.device_index()),
        addresses: n
            .private_ip_addresses()
            .iter()
            .filter_map(|a| a.private_ip_address())
            .filter(|a| Some(*a) != primary)
            .map(String::from)
            .collect(),
        prefixes: n
            .ipv4_prefixes()
            .iter()
            .filter_map(|p| p.ipv4_prefix())
            .map(String::from)
            .collect(),
        tags: n
            .tag_set()
            .iter()
            .filter_map(|t| Some((t.key()?.to_string(), t.value()?.to_string())))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::{
        NetworkInterface, NetworkInterfaceAttachment, NetworkInterfacePrivateIpAddress,
    };

    #[test]
    fn view_drops_the_primary_and_keeps_ownership_tags() {
        let n = NetworkInterface::builder()
            .network_interface_id("eni-1")
            .status(NetworkInterfaceStatus::InUse)
            .private_ip_address("10.0.0.5")
            .private_ip_addresses(
                NetworkInterfacePrivateIpAddress::builder()
                    .private_ip_address("10.0.0.5")
                    .primary(true)
                    .build(),
            )
            .private_ip_addresses(
                NetworkInterfacePrivateIpAddress::builder()
                    .private_ip_address("10.0.0.6")
                    .build(),
            )
            .attachment(
                NetworkInterfaceAttachment::builder()
                    .instance_id("i-1")
                    .device_index(1)
                    .build(),
            )
            .tag_set(Tag::builder().key(OWNER_CLUSTER_TAG).value("e2e").build())
            .build();
        let v = view(&n);
        assert_eq!(v.status, "in-use");
        assert_eq!(v.addresses, vec!["10.0.0.6".to_string()]);
        assert_eq!(v.instance_id.as_deref(), Some("i-1"));
        assert_eq!(v.device_index, Some(1));
        assert_eq!(
            v.tags.get(OWNER_CLUSTER_TAG).map(String::as_str),
            Some("e2e")
        );
    }
}
