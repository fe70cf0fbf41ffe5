//! `ec2-sim`: the testkit EC2 simulator served as the EC2 Query API (see `testkit::wire`).
//!
//! ```text
//! cargo run -p testkit --bin ec2-sim -- --listen 127.0.0.1:0 --mutate-latency-ms 300
//! ```
//!
//! Prints its endpoint (`http://ADDR`) as the first line on stdout, then serves until killed.

use std::io::Write;
use std::time::Duration;

use clap::Parser;
use eni_operator::ec2::model::{InstanceTypeLimits, Operation};
use testkit::sim::{Fault, Simulator};
use testkit::wire::{Server, parse_bucket, parse_operation};

#[derive(Parser, Debug)]
#[command(
    name = "ec2-sim",
    about = "The eni-operator test simulator of EC2, served as the EC2 Query API (signatures are not checked)"
)]
struct Args {
    /// Address to listen on; port 0 picks a free one. The endpoint is printed on stdout.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Availability zones of the Region (what DescribeAvailabilityZones lists).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "us-east-1a,us-east-1b,us-east-1c"
    )]
    zones: Vec<String>,
    /// Latency of every mutating action (create, attach, assign, ...), milliseconds.
    #[arg(long, default_value_t = 0)]
    mutate_latency_ms: u64,
    /// Latency of every describe, milliseconds.
    #[arg(long, default_value_t = 0)]
    describe_latency_ms: u64,
    /// Items per describe page when the client sends no (smaller) MaxResults.
    #[arg(long, default_value_t = testkit::sim::DEFAULT_PAGE_SIZE)]
    page_size: usize,
    /// How long a detached ENI stays `detaching`, milliseconds.
    #[arg(long, default_value_t = 0)]
    detach_delay_ms: u64,
    /// No throttling at all (AWS's per-account buckets are on by default).
    #[arg(long)]
    no_throttling: bool,
    /// Override a throttling bucket: NAME=BURST:PER_SECOND (repeatable), NAME an action's bucket
    /// (kebab-case: describe-instances, attach-network-interface, ...) or a group of them
    /// (`describe`: every describe; `general-mutating`: attach, detach, associate and
    /// disassociate).
    #[arg(long = "bucket", value_name = "NAME=BURST:PER_SECOND")]
    buckets: Vec<String>,
    /// Share (0..1) of every bucket's refill used by another tenant of the account.
    #[arg(long, default_value_t = 0.0)]
    other_tenant_share: f64,
    /// Another tenant's spell: AFTER seconds from the start it takes every token left and 90 %
    /// (or SHARE) of every bucket's refill for LENGTH seconds (`POST /_sim/tenant-spell` sets
    /// one while running).
    #[arg(long, value_name = "AFTER:LENGTH[:SHARE]")]
    tenant_spell: Option<String>,
    /// Answer a fraction of an action's calls with an error: ACTION=RATE[:CODE] (repeatable;
    /// CODE defaults to InternalError, HTTP 500).
    #[arg(long = "fault-rate", value_name = "ACTION=RATE[:CODE]")]
    fault_rates: Vec<String>,
    /// Eventual consistency: each ENI change stays invisible to describes for up to this long.
    #[arg(long, default_value_t = 0)]
    eventual_consistency_ms: u64,
    /// With eventual consistency: calls naming an ENI not visible yet are refused (NotFound).
    #[arg(long)]
    refuse_unseen: bool,
    /// Seed of every random choice (faults, lag).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Extra instance type: NAME=ENIS:IPV4_PER_ENI[:xen] (repeatable; Nitro unless `xen`).
    #[arg(long = "instance-type", value_name = "NAME=ENIS:IPS[:xen]")]
    instance_types: Vec<String>,
    /// The instance the metadata endpoint (`/latest/...` on the same port) describes; default:
    /// the running instance with the smallest ID (`POST /_sim/metadata?instance-id=` changes it).
    #[arg(long)]
    metadata_instance: Option<String>,
}

fn split_pair(s: &str) -> Result<(&str, &str), String> {
    s.split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=VALUE"))
}

fn num<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{what}: {s:?} is not a number"))
}

/// Types the e2e suite launches beyond the simulator's defaults (limits from AWS's
/// "Maximum IP addresses per network interface" table).
fn extra_types() -> Vec<InstanceTypeLimits> {
    vec![InstanceTypeLimits {
        instance_type: "c5.xlarge".into(),
        max_enis: 4,
        ipv4_per_eni: 15,
        ipv6_per_eni: 15,
        nitro: true,
        bare_metal: false,
        enis_per_card: Vec::new(),
    }]
}

fn configure(sim: &Simulator, a: &Args) -> Result<(), String> {
    sim.set_page_size(a.page_size);
    sim.set_detach_delay(Duration::from_millis(a.detach_delay_ms));
    sim.set_seed(a.seed);
    for op in Operation::ALL {
        let ms = if op.is_mutating() {
            a.mutate_latency_ms
        } else {
            a.describe_latency_ms
        };
        sim.set_latency(op, Duration::from_millis(ms));
    }
    if a.no_throttling {
        sim.disable_throttling();
    }
    for b in &a.buckets {
        let (name, v) = split_pair(b)?;
        let buckets = parse_bucket(name).ok_or_else(|| format!("unknown bucket {name:?}"))?;
        let (burst, rate) = v
            .split_once(':')
            .ok_or_else(|| format!("{b:?}: expected NAME=BURST:PER_SECOND"))?;
        for bucket in buckets {
            sim.set_bucket(bucket, num(burst, "burst")?, num(rate, "per second")?);
        }
    }
    if a.other_tenant_share > 0.0 {
        sim.set_other_tenant_share(a.other_tenant_share);
    }
    if let Some(spell) = &a.tenant_spell {
        let mut parts = spell.split(':');
        let (Some(after), Some(length)) = (parts.next(), parts.next()) else {
            return Err(format!("{spell:?}: expected AFTER:LENGTH[:SHARE]"));
        };
        let share = parts.next().map_or(Ok(0.9), |s| num(s, "share"))?;
        let secs = |s: &str, what| num::<f64>(s, what).map(|n| Duration::from_secs_f64(n.max(0.0)));
        sim.tenant_spell(secs(after, "after")?, secs(length, "length")?, share);
    }
    for f in &a.fault_rates {
        let (name, v) = split_pair(f)?;
        let op = parse_operation(name).ok_or_else(|| format!("unknown action {name:?}"))?;
        let (rate, code) = v.split_once(':').unwrap_or((v, "InternalError"));
        let status = match code {
            "InternalError" | "InternalFailure" => 500,
            "RequestLimitExceeded" | "Unavailable" | "ServiceUnavailable" => 503,
            _ => 400,
        };
        let fault = Fault::new(code, "injected by ec2-sim", status);
        sim.set_fault_rate(op, num(rate, "rate")?, fault);
    }
    if a.eventual_consistency_ms > 0 {
        sim.set_eventual_consistency(
            Duration::from_millis(a.eventual_consistency_ms),
            a.refuse_unseen,
            a.seed,
        );
    }
    for t in extra_types() {
        sim.add_instance_type(t);
    }
    for t in &a.instance_types {
        let (name, v) = split_pair(t)?;
        let mut parts = v.split(':');
        let enis = num(parts.next().unwrap_or_default(), "ENIs")?;
        let ips = num(parts.next().unwrap_or_default(), "IPs per ENI")?;
        let nitro = parts.next() != Some("xen");
        sim.add_instance_type(InstanceTypeLimits {
            instance_type: name.to_owned(),
            max_enis: enis,
            ipv4_per_eni: ips,
            ipv6_per_eni: ips,
            nitro,
            bare_metal: false,
            enis_per_card: Vec::new(),
        });
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let sim = Simulator::new();
    if let Err(e) = configure(&sim, &args) {
        eprintln!("ec2-sim: {e}");
        std::process::exit(2);
    }
    let (addr, task) = Server::new(sim, args.zones.clone())
        .with_metadata_instance(args.metadata_instance.clone())
        .spawn(&args.listen)
        .await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "http://{addr}")?;
    out.flush()?;
    drop(out);
    eprintln!("ec2-sim: serving the EC2 Query API on http://{addr} (signatures are not checked)");
    tokio::select! {
        r = task => r.map_err(std::io::Error::other)?,
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}
