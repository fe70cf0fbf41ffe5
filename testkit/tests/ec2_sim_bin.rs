//! The `ec2-sim` binary as scripts use it: it prints its endpoint as the first line on stdout,
//! serves the seeding and the operator's actions, and its flags reach the simulator (here a
//! bucket override: the second create is throttled).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A form POST to `/`; the status and body.
fn post(addr: &str, form: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to ec2-sim");
    write!(
        s,
        "POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}",
        form.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, answer.split_once("\r\n\r\n").unwrap().1.to_owned())
}

/// The text of the first `<tag>` in `xml`.
fn first(xml: &str, tag: &str) -> String {
    let open = format!("<{tag}>");
    let start = xml
        .find(&open)
        .unwrap_or_else(|| panic!("no <{tag}> in {xml}"))
        + open.len();
    xml[start..].split('<').next().unwrap().to_owned()
}

#[test]
fn prints_its_endpoint_and_applies_its_flags() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ec2-sim"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--bucket",
            "create-network-interface=1:0",
            "--zones",
            "eu-west-1a,eu-west-1b",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ec2-sim");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _child = Killed(child);
    let addr = line
        .trim()
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("first line is not an endpoint: {line:?}"))
        .to_owned();

    let (_, zones) = post(&addr, "Action=DescribeAvailabilityZones");
    assert_eq!(first(&zones, "zoneName"), "eu-west-1a");
    let (_, vpc) = post(&addr, "Action=CreateVpc&CidrBlock=10.0.0.0%2F16");
    let vpc = first(&vpc, "vpcId");
    let (status, subnet) = post(
        &addr,
        &format!(
            "Action=CreateSubnet&VpcId={vpc}&CidrBlock=10.0.0.0%2F24&AvailabilityZone=eu-west-1a"
        ),
    );
    assert_eq!(status, 200, "{subnet}");
    let subnet = first(&subnet, "subnetId");
    // AWS refuses a subnet overlapping another one.
    let (status, clash) = post(
        &addr,
        &format!(
            "Action=CreateSubnet&VpcId={vpc}&CidrBlock=10.0.0.0%2F25&AvailabilityZone=eu-west-1a"
        ),
    );
    assert_eq!(
        (status, first(&clash, "Code")),
        (400, "InvalidSubnet.Conflict".into())
    );

    let create = format!("Action=CreateNetworkInterface&SubnetId={subnet}&Ipv4PrefixCount=1");
    let (status, eni) = post(&addr, &create);
    assert_eq!(status, 200, "{eni}");
    let prefix = first(&eni, "ipv4Prefix");
    assert!(
        prefix.starts_with("10.0.0.") && prefix.ends_with("/28"),
        "{eni}"
    );
    let (status, throttled) = post(&addr, &create);
    assert_eq!(status, 503, "{throttled}");
    assert_eq!(first(&throttled, "Code"), "RequestLimitExceeded");
}
