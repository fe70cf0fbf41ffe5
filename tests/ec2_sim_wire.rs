//! `ec2-sim` on the wire beyond the contract suite (`tests/ec2_contract.rs` runs that through
//! it): AWS's error envelope and HTTP statuses, `RequestLimitExceeded` from the per-account
//! buckets as the SDK sees it, `MaxResults` pagination, and the control endpoints.

mod support;

use std::net::SocketAddr;

use eni_operator::ec2::aws::{AwsClientConfig, AwsEc2};
use eni_operator::ec2::*;
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
    let vpc = sim.add_vpc("10.0.0.0/16".parse().unwrap(), &[]);
    let subnet = sim.add_subnet(
        &vpc,
        "us-east-1a",
        "10.0.0.0/20".parse().unwrap(),
        Tags::new(),
    );
    let sg = sim.add_security_group(&vpc, Tags::new());
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
    let all = collect_pages(|t| aws.describe_network_interfaces(&filter, t))
        .await
        .unwrap();
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
    let types = collect_pages(|t| c.describe_instance_types(&p5, t))
        .await
        .unwrap();
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
    let enis = collect_pages(|t| c.describe_network_interfaces(&filter, t))
        .await
        .unwrap();
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
