//! `ec2-sim` on the wire beyond the contract suite (`tests/it/ec2_contract.rs` runs that through
//! it): AWS's error envelope and HTTP statuses, `RequestLimitExceeded` from the per-account
//! buckets as the SDK sees it, `MaxResults` pagination, and the control endpoints.

use crate::support;

use std::net::SocketAddr;

use eni_operator::ec2::aws::{AwsClientConfig, AwsEc2};
use eni_operator::ec2::*;
use testkit::cluster::{Network, network};
use testkit::every_page;
use testkit::sim::Simulator;
use testkit::wire::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct World {
    sim: Simulator,
    addr: SocketAddr,
    subnet: String,
    sg: String,
    instance: String,
}

async fn world() -> World {
    let sim = Simulator::new();
    let Network { subnet, sg, .. } = network(&sim, "10.0.0.0/16", "us-east-1a", "10.0.0.0/20");
    let instance = sim
        .run_instance("m5.24xlarge", &subnet, std::slice::from_ref(&sg))
        .id;
    let (addr, _task) = Server::new(sim.clone(), vec!["us-east-1a".into()])
        .spawn("127.0.0.1:0")
        .await
        .unwrap();
    World {
        sim,
        addr,
        subnet,
        sg,
        instance,
    }
}

/// `AwsEc2` on ec2-sim, with the given page size (`MaxResults`).
async fn client(addr: SocketAddr, max_results: Option<i32>) -> AwsEc2 {
    let config = AwsClientConfig {
        region: Some(support::moto::REGION.into()),
        endpoint_url: Some(format!("http://{addr}")),
        max_results_per_call: max_results,
        ..AwsClientConfig::default()
    };
    let loader = config
        .loader()
        .credentials_provider(aws_sdk_ec2::config::Credentials::new(
            "any", "any", None, None, "test",
        ));
    AwsEc2::from_loader(loader, max_results).await
}

/// A raw form POST; returns the status and the body.
async fn post(addr: SocketAddr, path: &str, form: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}",
        form.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = answer.split_once("\r\n\r\n").unwrap().1.to_owned();
    (status, body)
}

fn request(w: &World, tag: &str) -> CreateEniRequest {
    CreateEniRequest {
        subnet_id: w.subnet.clone(),
        security_groups: vec![w.sg.clone()],
        description: "wire".into(),
        tags: Tags::from([("t".to_owned(), tag.to_owned())]),
        addresses: AddressRequest::Ips(1),
        client_token: String::new(),
    }
}

#[tokio::test]
async fn throttled_calls_answer_request_limit_exceeded_with_503() {
    let w = world().await;
    let (status, _) = post(
        w.addr,
        "/_sim/bucket",
        "bucket=create-network-interface&burst=1&per_second=0",
    )
    .await;
    assert_eq!(status, 204);
    let aws = client(w.addr, None).await;
    aws.create_network_interface(&request(&w, "a"))
        .await
        .unwrap();
    let err = aws
        .create_network_interface(&request(&w, "b"))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Throttled, "{err}");
    assert_eq!(err.code, "RequestLimitExceeded");

    let form = format!(
        "Action=CreateNetworkInterface&Version=2016-11-15&SubnetId={}",
        w.subnet
    );
    let (status, body) = post(w.addr, "/", &form).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("<Response><Errors><Error><Code>RequestLimitExceeded</Code>"),
        "{body}"
    );
    assert!(body.contains("<RequestID>"), "{body}");

    let stats = w.sim.stats().get(Operation::CreateNetworkInterface);
    assert_eq!((stats.calls, stats.ok, stats.throttled), (3, 1, 2));
    let v: serde_json::Value = serde_json::from_str(&get(w.addr, "/_sim/stats").await).unwrap();
    assert_eq!(v["ops"]["CreateNetworkInterface"]["throttled"], 2, "{v}");
    assert_eq!(v["total"]["throttled"], 2, "{v}");

    // Back to AWS's buckets: allowed again.
    assert_eq!(post(w.addr, "/_sim/reset-throttling", "").await.0, 204);
    aws.create_network_interface(&request(&w, "c"))
        .await
        .unwrap();
}

#[tokio::test]
async fn another_tenant_takes_the_refill_and_empties_the_buckets_over_the_control_plane() {
    let w = world().await;
    // One token, refilled 2 per second: after 600 ms there is one again, unless another
    // tenant takes the whole refill.
    let (status, _) = post(
        w.addr,
        "/_sim/bucket",
        "bucket=create-network-interface&burst=1&per_second=2",
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(post(w.addr, "/_sim/other-tenant", "share=1").await.0, 204);
    let aws = client(w.addr, None).await;
    let create = |tag: &'static str| {
        let (aws, req) = (&aws, request(&w, tag));
        async move { aws.create_network_interface(&req).await }
    };
    let wait = || tokio::time::sleep(std::time::Duration::from_millis(600));
    create("a").await.unwrap();
    wait().await;
    let err = create("b").await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Throttled, "{err}");
    // The tenant leaves: the refill is ours again.
    assert_eq!(post(w.addr, "/_sim/other-tenant?share=0", "").await.0, 204);
    wait().await;
    create("c").await.unwrap();
    wait().await;
    // Its burst takes the token that refilled: throttled at once, ours again after a refill.
    let (status, _) = post(w.addr, "/_sim/other-tenant", "share=0&empty=true").await;
    assert_eq!(status, 204);
    let err = create("d").await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Throttled, "{err}");
    wait().await;
    create("e").await.unwrap();
    for bad in ["share=1.5", "share=x", ""] {
        let (status, body) = post(w.addr, "/_sim/other-tenant", bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
}

async fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    answer.split_once("\r\n\r\n").unwrap().1.to_owned()
}

#[tokio::test]
async fn max_results_pages_through_the_sdk() {
    let w = world().await;
    for i in 0..12 {
        w.sim
            .create_network_interface(&request(&w, &i.to_string()))
            .await
            .unwrap();
    }
    let before = w
        .sim
        .stats()
        .get(Operation::DescribeNetworkInterfaces)
        .calls;
    let aws = client(w.addr, Some(5)).await;
    let filter = EniFilter {
        subnet_ids: vec![w.subnet.clone()],
        ..EniFilter::default()
    };
    let all = every_page(|t| aws.describe_network_interfaces(&filter, t)).await;
    // 12 created + the instance's primary ENI, in pages of 5.
    assert_eq!(all.len(), 13);
    let ids: std::collections::BTreeSet<_> = all.iter().map(|e| &e.id).collect();
    assert_eq!(ids.len(), 13, "no ENI twice across pages");
    let calls = w
        .sim
        .stats()
        .get(Operation::DescribeNetworkInterfaces)
        .calls
        - before;
    assert_eq!(calls, 3);

    // AWS refuses MaxResults with IDs, and outside 5..=1000.
    let (status, body) = post(
        w.addr,
        "/",
        "Action=DescribeNetworkInterfaces&MaxResults=5&NetworkInterfaceId.1=eni-1",
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        body.contains("<Code>InvalidParameterCombination</Code>"),
        "{body}"
    );
    let (status, body) = post(w.addr, "/", "Action=DescribeInstances&MaxResults=2").await;
    assert_eq!(status, 400);
    assert!(
        body.contains("<Code>InvalidParameterValue</Code>"),
        "{body}"
    );
}

#[tokio::test]
async fn bad_requests_get_aws_error_codes() {
    let w = world().await;
    for (form, code) in [
        ("Version=2016-11-15", "MissingParameter"),
        ("Action=DescribeUnicorns", "InvalidAction"),
        (
            "Action=DescribeNetworkInterfaces&Filter.1.Name=color&Filter.1.Value.1=red",
            "InvalidParameterValue",
        ),
        (
            "Action=AttachNetworkInterface&NetworkInterfaceId=eni-0&InstanceId=i-0&DeviceIndex=1",
            "InvalidNetworkInterfaceID.NotFound",
        ),
    ] {
        let (status, body) = post(w.addr, "/", form).await;
        assert_eq!(status, 400, "{form}: {body}");
        assert!(
            body.contains(&format!("<Code>{code}</Code>")),
            "{form}: {body}"
        );
    }
    // Injected faults answer as AWS's server errors do.
    let (status, _) = post(
        w.addr,
        "/_sim/fault",
        "operation=DescribeInstances&code=InternalError&times=1",
    )
    .await;
    assert_eq!(status, 204);
    let (_, _) = post(
        w.addr,
        "/_sim/fault",
        "operation=DescribeSubnets&code=UnauthorizedOperation&times=1",
    )
    .await;
    let (status, body) = post(w.addr, "/", "Action=DescribeSubnets").await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("<Code>UnauthorizedOperation</Code>"),
        "{body}"
    );
    let aws = client(w.addr, None).await;
    let err = aws
        .describe_instances(&InstanceFilter::default(), None)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Transient, "{err}");
    let page = aws
        .describe_instances(&InstanceFilter::default(), None)
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].id, w.instance);
    assert_eq!(page.items[0].state, InstanceState::Running);
}

/// Issue 29 item 4: a p5 launched with EFA interfaces (`RunInstances` with
/// `NetworkInterface.N`) reads back through the real SDK with its network cards, each
/// interface's `NetworkCardIndex` and `InterfaceType`, and no address on the `efa-only` one.
#[tokio::test]
async fn a_p5_with_efa_interfaces_reads_back_with_cards_and_interface_types() {
    let w = world().await;
    let form = format!(
        "Action=RunInstances&InstanceType=p5.48xlarge&SubnetId={subnet}&SecurityGroupId.1={sg}\
         &MinCount=1&MaxCount=1\
         &NetworkInterface.1.NetworkCardIndex=0&NetworkInterface.1.DeviceIndex=0\
         &NetworkInterface.1.InterfaceType=interface\
         &NetworkInterface.2.NetworkCardIndex=1&NetworkInterface.2.DeviceIndex=0\
         &NetworkInterface.2.InterfaceType=efa&NetworkInterface.2.SecurityGroupId.1={sg}\
         &NetworkInterface.3.NetworkCardIndex=2&NetworkInterface.3.DeviceIndex=0\
         &NetworkInterface.3.InterfaceType=efa-only&NetworkInterface.3.SecurityGroupId.1={sg}",
        subnet = w.subnet,
        sg = w.sg
    );
    let (status, body) = post(w.addr, "/", &form).await;
    assert_eq!(status, 200, "{body}");
    let c = client(w.addr, None).await;
    let p5 = ["p5.48xlarge".to_owned()];
    let types = every_page(|t| c.describe_instance_types(&p5, t)).await;
    assert_eq!(types[0].max_enis, 64);
    assert_eq!(types[0].enis_per_card, vec![2; 32]);
    assert_eq!(types[0].pod_max_enis(), 2);

    let instance = body
        .split("<instanceId>")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .expect("an instance")
        .to_owned();
    let filter = EniFilter {
        instance_ids: vec![instance.clone()],
        ..EniFilter::default()
    };
    let enis = every_page(|t| c.describe_network_interfaces(&filter, t)).await;
    let mut seen: Vec<(u32, u32, String, bool)> = enis
        .iter()
        .map(|e| {
            let a = e.attachment.as_ref().expect("attached");
            (
                a.network_card_index,
                a.device_index,
                e.interface_type.as_str().to_owned(),
                e.primary_ip.is_unspecified(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (0, 0, "interface".to_owned(), false),
            (1, 0, "efa".to_owned(), false),
            (2, 0, "efa-only".to_owned(), true),
        ]
    );
    let primary = enis.iter().find(|e| e.is_primary()).expect("a primary");
    assert_eq!(primary.interface_type, InterfaceType::Interface);
    // EC2 lists ENIs by ID, not by card: here the EFAs come first.
    assert_ne!(enis[0].id, primary.id, "{enis:?}");
    // Card 0 takes two interfaces: one attach at device 1, and no more.
    let eni = c
        .create_network_interface(&request(&w, "pods"))
        .await
        .unwrap();
    c.attach_network_interface(&eni.id, &instance, 1)
        .await
        .unwrap();
    let more = c
        .create_network_interface(&request(&w, "more"))
        .await
        .unwrap();
    let refused = c.attach_network_interface(&more.id, &instance, 2).await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(!w.sim.network_interface(&eni.id).unwrap().is_primary());
}

/// A raw request with extra headers; returns the status and the body.
async fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, answer.split_once("\r\n\r\n").unwrap().1.to_owned())
}

/// What Cilium's operator sends (1.20, `pkg/aws/api`): `DescribeNetworkInterfaces` filtered by
/// `private-ip-address` with a wildcard, several subnets in one filter, `tag-key`,
/// `attachment.device-index`; AWS documents every one of them, ec2-sim refused the first
/// ("The filter 'private-ip-address' is invalid") and with it Cilium's whole first resync.
#[tokio::test]
async fn eni_filters_take_aws_names_several_values_and_wildcards() {
    let w = world().await;
    let other = w.sim.add_subnet(
        &w.sim.instance(&w.instance).unwrap().vpc_id,
        "us-east-1a",
        "10.0.16.0/20".parse().unwrap(),
        Tags::new(),
    );
    let a = w
        .sim
        .create_network_interface(&request(&w, "a"))
        .await
        .unwrap();
    let mut rb = request(&w, "b");
    rb.subnet_id = other.clone();
    let b = w.sim.create_network_interface(&rb).await.unwrap();
    let ids = |body: &str| -> Vec<String> {
        body.split("<networkInterfaceId>")
            .skip(1)
            .map(|s| s.split('<').next().unwrap().to_owned())
            .collect()
    };
    let q = |filters: &str| format!("Action=DescribeNetworkInterfaces{filters}");
    let (status, body) = post(
        w.addr,
        "/",
        &q("&Filter.1.Name=private-ip-address&Filter.1.Value.1=*"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids(&body).len(), 3, "{body}");
    let (_, body) = post(
        w.addr,
        "/",
        &q(&format!(
            "&Filter.1.Name=private-ip-address&Filter.1.Value.1={}",
            b.primary_ip
        )),
    )
    .await;
    assert_eq!(ids(&body), std::slice::from_ref(&b.id));
    let (_, body) = post(
        w.addr,
        "/",
        &q(&format!(
            "&Filter.1.Name=subnet-id&Filter.1.Value.1={}&Filter.1.Value.2={other}\
             &Filter.2.Name=private-ip-address&Filter.2.Value.1=10.0.*",
            w.subnet
        )),
    )
    .await;
    assert_eq!(ids(&body).len(), 3, "{body}");
    let (_, body) = post(
        w.addr,
        "/",
        &q("&Filter.1.Name=tag-key&Filter.1.Value.1=t&Filter.2.Name=description&Filter.2.Value.1=*"),
    )
    .await;
    let mut got = ids(&body);
    got.sort();
    let mut want = vec![a.id.clone(), b.id.clone()];
    want.sort();
    assert_eq!(got, want, "{body}");
    let (_, body) = post(
        w.addr,
        "/",
        &q("&Filter.1.Name=attachment.device-index&Filter.1.Value.1=0"),
    )
    .await;
    assert_eq!(ids(&body).len(), 1, "the instance's primary ENI: {body}");
}

/// The instance metadata service on ec2-sim's port, as Cilium's operator reads it: an IMDSv2
/// token, the identity document's Region, and its instance's MAC, VPC and subnet.
#[tokio::test]
async fn the_metadata_endpoint_serves_the_identity_document_and_the_vpc() {
    let w = world().await;
    let (status, token) = raw(
        w.addr,
        "PUT",
        "/latest/api/token",
        "X-aws-ec2-metadata-token-ttl-seconds: 21600\r\n",
        "",
    )
    .await;
    assert_eq!(status, 200, "{token}");
    assert!(!token.is_empty());
    let (status, _) = raw(w.addr, "PUT", "/latest/api/token", "", "").await;
    assert_eq!(
        status, 400,
        "AWS refuses a token request without a lifetime"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&get(w.addr, "/latest/dynamic/instance-identity/document").await)
            .unwrap();
    assert_eq!(doc["region"], "us-east-1", "{doc}");
    assert_eq!(doc["instanceId"], w.instance.as_str(), "{doc}");
    let inst = w.sim.instance(&w.instance).unwrap();
    assert_eq!(
        get(w.addr, "/latest/meta-data/instance-id").await,
        w.instance
    );
    assert_eq!(
        get(w.addr, "/latest/meta-data/instance-type").await,
        "m5.24xlarge"
    );
    assert_eq!(
        get(w.addr, "/latest/meta-data/placement/availability-zone").await,
        "us-east-1a"
    );
    let mac = get(w.addr, "/latest/meta-data/mac").await;
    assert!(mac.contains(':'), "{mac}");
    let base = format!("/latest/meta-data/network/interfaces/macs/{mac}");
    assert_eq!(get(w.addr, &format!("{base}/vpc-id")).await, inst.vpc_id);
    assert_eq!(get(w.addr, &format!("{base}/subnet-id")).await, w.subnet);
    let (status, _) = raw(w.addr, "GET", "/latest/meta-data/nothing-here", "", "").await;
    assert_eq!(status, 404);
}

/// Two clients (access keys) on one account: ec2-sim counts each one's calls and keeps each
/// mutating call with the instance it touched, so a test can tell two allocators apart.
#[tokio::test]
async fn calls_are_recorded_per_client_with_the_instance_they_touched() {
    let w = world().await;
    let eni = w
        .sim
        .create_network_interface(&request(&w, "x"))
        .await
        .unwrap();
    let auth = |key: &str| {
        format!(
            "Authorization: AWS4-HMAC-SHA256 Credential={key}/20260101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=0\r\n"
        )
    };
    let (status, body) = raw(
        w.addr,
        "POST",
        "/",
        &auth("CILIUM"),
        &format!(
            "Action=AttachNetworkInterface&NetworkInterfaceId={}&InstanceId={}&DeviceIndex=1&NetworkCardIndex=0",
            eni.id, w.instance
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = raw(
        w.addr,
        "POST",
        "/",
        &auth("OURS"),
        &format!(
            "Action=AssignPrivateIpAddresses&NetworkInterfaceId={}&SecondaryPrivateIpAddressCount=2",
            eni.id
        ),
    )
    .await;
    assert_eq!(status, 200);
    raw(w.addr, "POST", "/", &auth("OURS"), "Action=DescribeSubnets").await;
    let r: serde_json::Value = serde_json::from_str(&get(w.addr, "/_sim/clients").await).unwrap();
    assert_eq!(
        r["clients"]["CILIUM"]["AttachNetworkInterface"]["ok"], 1,
        "{r}"
    );
    assert_eq!(r["clients"]["OURS"]["DescribeSubnets"]["calls"], 1, "{r}");
    assert!(
        r["clients"]["CILIUM"].get("DescribeSubnets").is_none(),
        "{r}"
    );
    let m = r["mutating"].as_array().unwrap();
    assert_eq!(m.len(), 2, "{r}");
    assert_eq!(m[0]["client"], "CILIUM");
    assert_eq!(m[1]["client"], "OURS");
    assert_eq!(m[1]["action"], "AssignPrivateIpAddresses");
    assert_eq!(
        m[1]["instance"],
        w.instance.as_str(),
        "the ENI's instance: {r}"
    );
    assert_eq!(post(w.addr, "/_sim/clients/reset", "").await.0, 204);
    let r: serde_json::Value = serde_json::from_str(&get(w.addr, "/_sim/clients").await).unwrap();
    assert!(r["mutating"].as_array().unwrap().is_empty());
}

/// Elastic IPs on the wire (Cilium's and our static IPs): DescribeAddresses by tag, then
/// AssociateAddress with an ENI's primary address.
#[tokio::test]
async fn elastic_ips_are_described_by_tag_and_associated() {
    let w = world().await;
    let alloc = w.sim.add_address(
        "198.51.100.7".parse().unwrap(),
        Tags::from([("pool".to_owned(), "a".to_owned())]),
    );
    w.sim
        .add_address("198.51.100.8".parse().unwrap(), Tags::new());
    let (status, body) = post(
        w.addr,
        "/",
        "Action=DescribeAddresses&Filter.1.Name=tag:pool&Filter.1.Value.1=a",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&alloc) && !body.contains("198.51.100.8"),
        "{body}"
    );
    let eni = w.sim.primary_eni_id(&w.instance).unwrap();
    let (status, body) = post(
        w.addr,
        "/",
        &format!("Action=AssociateAddress&AllocationId={alloc}&NetworkInterfaceId={eni}"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("<associationId>"), "{body}");
    let a = w
        .sim
        .addresses()
        .into_iter()
        .find(|a| a.allocation_id == alloc)
        .unwrap();
    assert_eq!(a.network_interface_id.as_deref(), Some(eni.as_str()));
}

/// A VPC made through the wire (`CreateVpc`) has its main route table, as on AWS: Cilium's
/// operator found none ("numRouteTables=0") and warned that the node's and the pod subnets
/// were "not in the same route tables".
#[tokio::test]
async fn a_new_vpc_has_its_main_route_table() {
    let w = world().await;
    let (status, body) = post(w.addr, "/", "Action=CreateVpc&CidrBlock=10.9.0.0%2F16").await;
    assert_eq!(status, 200, "{body}");
    let vpc = body
        .split("<vpcId>")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .unwrap()
        .to_owned();
    let (status, body) = post(
        w.addr,
        "/",
        &format!("Action=DescribeRouteTables&Filter.1.Name=vpc-id&Filter.1.Value.1={vpc}"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // One table (its association names it again).
    assert_eq!(body.matches("<ownerId>").count(), 1, "{body}");
    assert!(body.contains("<main>true</main>"), "{body}");
}
