//! The describes: filters as EC2 applies them, and opaque-token pagination.

use super::{EniRec, State, aws_err, require_ids, resource_match, tags_match};
use eni_operator::ec2::Result;
use eni_operator::ec2::model::*;

/// One page of `items` (sorted by `key`) after the opaque `token`.
pub(super) fn paginate<T>(
    op: Operation,
    mut items: Vec<T>,
    key: impl Fn(&T) -> &str,
    token: Option<String>,
    page_size: usize,
) -> Result<Page<T>> {
    items.sort_by(|a, b| key(a).cmp(key(b)));
    let start = match token.filter(|t| !t.is_empty()) {
        None => 0,
        Some(t) => {
            let after = decode_token(&t).ok_or_else(|| {
                aws_err(
                    op,
                    "InvalidParameterValue",
                    format!("Invalid value '{t}' for NextToken"),
                )
            })?;
            items.partition_point(|i| key(i) <= after.as_str())
        }
    };
    let mut rest = items.split_off(start.min(items.len()));
    let next_token = (rest.len() > page_size.max(1)).then(|| {
        rest.truncate(page_size.max(1));
        encode_token(key(rest.last().expect("page is not empty")))
    });
    Ok(Page {
        items: rest,
        next_token,
    })
}

/// Tokens are opaque to callers: the hex of the last key returned.
pub(crate) fn encode_token(last_key: &str) -> String {
    last_key.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_token(token: &str) -> Option<String> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

impl State {
    pub(crate) fn describe_instance_types(
        &self,
        types: &[String],
        token: Option<String>,
    ) -> Result<Page<InstanceTypeLimits>> {
        let op = Operation::DescribeInstanceTypes;
        let unknown: Vec<&str> = types
            .iter()
            .filter(|t| !self.types.contains_key(*t))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            return Err(aws_err(
                op,
                "InvalidInstanceType",
                format!(
                    "The following supplied instance types do not exist: [{}]",
                    unknown.join(", ")
                ),
            ));
        }
        let items = self
            .types
            .values()
            .filter(|t| types.is_empty() || types.contains(&t.instance_type))
            .cloned()
            .collect();
        paginate(op, items, |t| &t.instance_type, token, self.page_size)
    }

    pub(crate) fn describe_instances(
        &self,
        f: &InstanceFilter,
        token: Option<String>,
    ) -> Result<Page<Instance>> {
        let op = Operation::DescribeInstances;
        require_ids(
            op,
            &f.ids,
            |id| self.instances.contains_key(id),
            "InvalidInstanceID.NotFound",
            "instance",
        )?;
        let ids: std::collections::HashSet<&str> = f.ids.iter().map(String::as_str).collect();
        let items = self
            .instances
            .values()
            .filter(|i| ids.is_empty() || ids.contains(i.id.as_str()))
            .filter(|i| f.vpc_id.as_ref().is_none_or(|v| &i.vpc_id == v))
            .filter(|i| tags_match(&i.tags, &f.tags))
            .cloned()
            .collect();
        paginate(op, items, |i| &i.id, token, self.page_size)
    }

    pub(crate) fn describe_network_interfaces(
        &self,
        f: &EniFilter,
        token: Option<String>,
    ) -> Result<Page<NetworkInterface>> {
        let op = Operation::DescribeNetworkInterfaces;
        require_ids(
            op,
            &f.ids,
            |id| self.enis.contains_key(id),
            "InvalidNetworkInterfaceID.NotFound",
            "networkInterface",
        )?;
        // By instance through the index (batched refreshes name thousands of instances),
        // in ID order like the full scan.
        let candidates: Vec<&EniRec> = if f.instance_ids.is_empty() {
            self.enis.values().collect()
        } else {
            let mut recs: Vec<&EniRec> = f
                .instance_ids
                .iter()
                .flat_map(|i| self.enis_of_instance(i))
                .collect();
            recs.sort_by(|a, b| a.eni.id.cmp(&b.eni.id));
            recs.dedup_by(|a, b| a.eni.id == b.eni.id);
            recs
        };
        self.eni_page(f, candidates.into_iter().map(|r| &r.eni), token)
    }

    /// The page of `enis` (in ID order, already narrowed to `f`'s instances) that the rest of
    /// `f` selects. Paginates on references and clones only the page: a listing of N ENIs in
    /// pages must not copy all N for every page.
    pub(super) fn eni_page<'a>(
        &self,
        f: &EniFilter,
        enis: impl Iterator<Item = &'a NetworkInterface>,
        token: Option<String>,
    ) -> Result<Page<NetworkInterface>> {
        let items: Vec<&NetworkInterface> = enis
            .filter(|e| f.ids.is_empty() || f.ids.contains(&e.id))
            .filter(|e| f.vpc_id.as_ref().is_none_or(|v| &e.vpc_id == v))
            .filter(|e| f.subnet_ids.is_empty() || f.subnet_ids.contains(&e.subnet_id))
            .filter(|e| tags_match(&e.tags, &f.tags))
            .filter(|e| f.state.is_none_or(|s| e.state == s))
            .filter(|e| {
                f.private_ips.is_empty()
                    || std::iter::once(&e.primary_ip)
                        .chain(&e.secondary_ips)
                        .any(|ip| f.private_ips.contains(ip))
            })
            .collect();
        // AWS refuses MaxResults together with NetworkInterfaceIds, so ID lookups are one page.
        let page_size = if f.ids.is_empty() {
            self.page_size
        } else {
            usize::MAX
        };
        let page = paginate(
            Operation::DescribeNetworkInterfaces,
            items,
            |e| &e.id,
            token,
            page_size,
        )?;
        Ok(Page {
            items: page.items.into_iter().cloned().collect(),
            next_token: page.next_token,
        })
    }

    pub(crate) fn describe_subnets(
        &self,
        f: &ResourceFilter,
        token: Option<String>,
    ) -> Result<Page<Subnet>> {
        let op = Operation::DescribeSubnets;
        require_ids(
            op,
            &f.ids,
            |id| self.subnets.contains_key(id),
            "InvalidSubnetID.NotFound",
            "subnet",
        )?;
        let items = self
            .subnets
            .values()
            .map(|r| Subnet {
                available_addresses: r.pool.available(),
                ..r.subnet.clone()
            })
            .filter(|s| resource_match(f, &s.id, &s.vpc_id, &s.tags))
            .collect();
        paginate(op, items, |s| &s.id, token, self.page_size)
    }

    pub(crate) fn describe_vpcs(
        &self,
        f: &ResourceFilter,
        token: Option<String>,
    ) -> Result<Page<Vpc>> {
        let op = Operation::DescribeVpcs;
        require_ids(
            op,
            &f.ids,
            |id| self.vpcs.contains_key(id),
            "InvalidVpcID.NotFound",
            "vpc",
        )?;
        // The simulator's VPCs carry no tags: a tag filter matches none of them.
        let items = self
            .vpcs
            .values()
            .filter(|v| resource_match(f, &v.id, &v.id, &Tags::new()))
            .cloned()
            .collect();
        paginate(op, items, |v| &v.id, token, self.page_size)
    }

    pub(crate) fn describe_security_groups(
        &self,
        f: &ResourceFilter,
        token: Option<String>,
    ) -> Result<Page<SecurityGroup>> {
        let op = Operation::DescribeSecurityGroups;
        require_ids(
            op,
            &f.ids,
            |id| self.security_groups.contains_key(id),
            "InvalidGroup.NotFound",
            "security group",
        )?;
        let items = self
            .security_groups
            .values()
            .filter(|g| resource_match(f, &g.id, &g.vpc_id, &g.tags))
            .cloned()
            .collect();
        paginate(op, items, |g| &g.id, token, self.page_size)
    }

    pub(crate) fn describe_route_tables(
        &self,
        f: &ResourceFilter,
        token: Option<String>,
    ) -> Result<Page<RouteTable>> {
        let op = Operation::DescribeRouteTables;
        require_ids(
            op,
            &f.ids,
            |id| self.route_tables.contains_key(id),
            "InvalidRouteTableID.NotFound",
            "route table",
        )?;
        let items = self
            .route_tables
            .values()
            .filter(|r| resource_match(f, &r.id, &r.vpc_id, &Tags::new()))
            .cloned()
            .collect();
        paginate(op, items, |r| &r.id, token, self.page_size)
    }
}
