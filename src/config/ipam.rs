//! IPAM behaviour and the handover from Cilium's operator: the flags and the engine's
//! [`IpamConfig`] and the refresher's [`Scope`] they build.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;

use crate::cache::refresher::Scope;
use crate::ipam::IpamConfig;

use super::values::{Tag, parse_duration};

/// IPAM behaviour.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "IPAM")]
pub struct IpamSettings {
    /// Assign /28 prefixes instead of single addresses on Nitro instances (per-node opt-out:
    /// spec.eni.disable-prefix-delegation).
    #[arg(long, env = "ENI_OPERATOR_AWS_ENABLE_PREFIX_DELEGATION", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub aws_enable_prefix_delegation: bool,
    /// Release addresses above the node's needs (after --excess-ip-release-delay).
    #[arg(long, env = "ENI_OPERATOR_AWS_RELEASE_EXCESS_IPS", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub aws_release_excess_ips: bool,
    /// Seconds an address must stay in excess before it is released.
    #[arg(
        long,
        env = "ENI_OPERATOR_EXCESS_IP_RELEASE_DELAY",
        default_value_t = 180
    )]
    pub excess_ip_release_delay: u64,
    /// Offer each ENI's primary address to pods (+1 per ENI); per-node spec.eni.use-primary-address wins.
    #[arg(long, env = "ENI_OPERATOR_AWS_USE_PRIMARY_ADDRESS", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub aws_use_primary_address: bool,
    /// Extra tags for the ENIs we create, k=v[,k2=v2], repeatable.
    #[arg(long, env = "ENI_OPERATOR_ENI_TAGS", value_delimiter = ',')]
    pub eni_tags: Vec<Tag>,
    /// Cluster name, stored in the eni-operator.io/cluster-name ownership tag of created ENIs
    /// (the ENI GC deletes by it) [default: derived at start-up from the nodes' instance tags,
    /// aws:eks:cluster-name then kubernetes.io/cluster/<name>; all must agree, else the operator
    /// refuses to start].
    #[arg(long, env = "ENI_OPERATOR_CLUSTER_NAME")]
    pub cluster_name: Option<String>,
    /// New ENIs and addresses only in these subnets (IDs, comma-separated or repeated); a
    /// node's other ENIs are still known and listed.
    #[arg(long, env = "ENI_OPERATOR_SUBNET_IDS_FILTER", value_delimiter = ',')]
    pub subnet_ids_filter: Vec<String>,
    /// New ENIs and addresses only in subnets carrying all these tags, k=v[,k2=v2].
    #[arg(long, env = "ENI_OPERATOR_SUBNET_TAGS_FILTER", value_delimiter = ',')]
    pub subnet_tags_filter: Vec<Tag>,
    /// Only manage nodes whose instances carry all these tags, k=v[,k2=v2]; other nodes'
    /// CiliumNodes are left alone (another operator may serve them).
    #[arg(long, env = "ENI_OPERATOR_INSTANCE_TAGS_FILTER", value_delimiter = ',')]
    pub instance_tags_filter: Vec<Tag>,
    /// Only consider resources in this VPC (default: the VPC of the managed nodes, once known).
    #[arg(long, env = "ENI_OPERATOR_VPC_ID")]
    pub vpc_id: Option<String>,
    /// Put `ipam.cilium.io/ignore: "true"` on every CiliumNode we serve (so Cilium's operator leaves it to us), and remove it when we let a node go (eni-operator.cilium.io/ignore).
    #[arg(long, env = "ENI_OPERATOR_ANNOTATE_CILIUM_IGNORE", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub annotate_cilium_ignore: bool,
    /// The tag key=value an Elastic IP must carry before a node's spec.ipam.static-ip-tags may
    /// claim it (agents write those tags; this keeps them to the addresses meant for the
    /// cluster) [default: eni-operator.io/cluster-name=<--cluster-name>].
    #[arg(long, env = "ENI_OPERATOR_STATIC_IP_REQUIRED_TAG")]
    pub static_ip_required_tag: Option<Tag>,
    /// Touch only instances EC2 shows with this cluster's tag (aws:eks:cluster-name=<--cluster-name> or kubernetes.io/cluster/<--cluster-name>); off: any instance a Node's providerID names.
    #[arg(long, env = "ENI_OPERATOR_INSTANCE_CLUSTER_TAG_CHECK", default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub instance_cluster_tag_check: bool,

    // Cilium's instance-limit flags (operator/option/config.go, up to 1.17).
    /// Per-type limits that win over EC2 and the built-in table, type=adapters,ipv4,ipv6
    /// (e.g. a1.medium=2,4,4); repeatable, or `;`-separated in the environment variable.
    #[arg(
        long,
        env = "ENI_OPERATOR_AWS_INSTANCE_LIMIT_MAPPING",
        value_delimiter = ';'
    )]
    pub aws_instance_limit_mapping: Vec<crate::ec2::limits::LimitOverride>,
    /// Read instance-type limits with DescribeInstanceTypes; false: only the built-in table
    /// (AWS's published figures, src/ec2/instance_limits.csv) and --aws-instance-limit-mapping.
    #[arg(long, env = "ENI_OPERATOR_UPDATE_EC2_ADAPTER_LIMIT_VIA_API", default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub update_ec2_adapter_limit_via_api: bool,
}

impl IpamSettings {
    /// `--cluster-name`, once given or derived (`crate::cluster_name::resolve`, at start-up).
    ///
    /// # Panics
    /// When neither happened: every start-up path resolves it before building the core, so
    /// no ENI is ever tagged, or collected, under a name nobody chose.
    pub fn cluster_name(&self) -> &str {
        self.cluster_name
            .as_deref()
            .expect("--cluster-name is resolved at start-up before it is used")
    }

    pub fn eni_tags(&self) -> BTreeMap<String, String> {
        Tag::map(&self.eni_tags)
    }

    /// The refresher's [`Scope`]: `--vpc-id`, the subnet filters and `--instance-tags-filter`.
    pub fn scope(&self) -> Scope {
        Scope {
            vpc_id: self.vpc_id.clone(),
            subnet_ids: self.subnet_ids_filter.clone(),
            subnet_tags: self.subnet_tags(),
            instance_tags: self.instance_tags(),
        }
    }

    pub fn subnet_tags(&self) -> BTreeMap<String, String> {
        Tag::map(&self.subnet_tags_filter)
    }

    pub fn instance_tags(&self) -> BTreeMap<String, String> {
        Tag::map(&self.instance_tags_filter)
    }

    pub fn excess_ip_release_delay(&self) -> Duration {
        Duration::from_secs(self.excess_ip_release_delay)
    }

    /// The IPAM engine's switches, delay and ENI tags.
    pub fn ipam_config(&self) -> IpamConfig {
        IpamConfig {
            prefix_delegation: self.aws_enable_prefix_delegation,
            release_excess_ips: self.aws_release_excess_ips,
            release_delay: self.excess_ip_release_delay(),
            use_primary_address: self.aws_use_primary_address,
            eni_tags: self.eni_tags(),
            cluster_name: self.cluster_name().to_string(),
            static_ip_required_tag: self
                .static_ip_required_tag
                .as_ref()
                .map(|t| (t.key.clone(), t.value.clone())),
            ..IpamConfig::default()
        }
    }
}

/// Handing nodes over from Cilium's operator (`docs/migrating-from-cilium.md`).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Handover")]
pub struct HandoverSettings {
    /// Namespace of Cilium's operator: its leader Lease `cilium-operator-resource-lock` there
    /// tells whether it runs (the handover guard; needs `get` on that Lease).
    #[arg(
        long,
        env = "ENI_OPERATOR_CILIUM_NAMESPACE",
        default_value = "kube-system"
    )]
    pub cilium_namespace: String,
    /// Read Cilium operator's Lease at all (off: the guard relies on managedFields alone).
    #[arg(long, env = "ENI_OPERATOR_WATCH_CILIUM_LEASE", default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub watch_cilium_lease: bool,
    /// Cilium's operator is not installed in this cluster: a Lease that cannot be read or is
    /// not found does not hold nodes back. Without it the guard fails closed: until the
    /// Lease can be read, nodes not taken over yet wait (a 404 may mean a wrong
    /// --cilium-namespace).
    #[arg(long, env = "ENI_OPERATOR_CILIUM_OPERATOR_ABSENT", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub cilium_operator_absent: bool,
    /// You verified that Cilium's operator is 1.18 or later, so it honours
    /// `ipam.cilium.io/ignore`: the guard does not read its release from the
    /// `io.cilium.k8s.crd.schema.version` label of the CiliumNode CRD. Without it, while
    /// Cilium's Lease is held and that label names a release before 1.18 (or cannot be read),
    /// no node is taken over (`CiliumIgnoresAnnotation`).
    #[arg(long, env = "ENI_OPERATOR_CILIUM_HONOURS_IGNORE", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub cilium_honours_ignore: bool,
    /// How long another field manager's write of `spec.ipam.pool` / `status.eni` after ours
    /// counts as a running second allocator (longer than Cilium's one-minute resync).
    #[arg(long, env = "ENI_OPERATOR_HANDOVER_QUIET", default_value = "3m", value_parser = parse_duration)]
    pub handover_quiet: Duration,
    /// Canary handover: serve only CiliumNodes labelled key=value; a served node that loses
    /// the label is handed back (finalizer and Cilium's ignore annotation removed).
    #[arg(long, env = "ENI_OPERATOR_HANDOVER_SELECTOR")]
    pub handover_selector: Option<Tag>,
}
