//! The EC2 world a contract test runs against: seeded the same way in the simulator and in moto,
//! so one suite checks both backends.

/// A subnet created for the tests.
#[derive(Clone, Debug)]
pub struct SeededSubnet {
    pub id: String,
    pub availability_zone: String,
    pub cidr: String,
    pub tags: Vec<(String, String)>,
}

/// A running instance created for the tests, with its primary ENI at device index 0.
#[derive(Clone, Debug)]
pub struct SeededInstance {
    pub id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub subnet_id: String,
    pub primary_eni_id: String,
}

/// What was seeded: one VPC (primary CIDR 10.0.0.0/16, secondary 100.64.0.0/16) with
/// * subnets: `[0]` 10.0.0.0/24 in zone a (node subnet), `[1]` 100.64.0.0/20 in zone a tagged
///   `eni-operator-test/pods=true`, `[2]` 10.0.16.0/24 in zone b; a tiny `[3]` 10.0.32.0/28 in
///   zone a (11 usable addresses) for exhaustion tests;
/// * security groups: `[0]` tagged `eni-operator-test/pods=true`, `[1]` untagged;
/// * instances: `[0]` m5.large in zone a on subnet 0, `[1]` t3.medium in zone b on subnet 2.
#[derive(Clone, Debug)]
pub struct World {
    pub region: String,
    pub zone_a: String,
    pub zone_b: String,
    pub vpc_id: String,
    pub vpc_cidr: String,
    pub vpc_secondary_cidr: String,
    pub subnets: Vec<SeededSubnet>,
    pub security_groups: Vec<String>,
    pub instances: Vec<SeededInstance>,
    /// True when the backend enforces AWS's rules (limits, capacity, prefixes, idempotency,
    /// pagination): the simulator. False for moto, which does not (see docs/emulators.md).
    pub enforces_aws_rules: bool,
}
