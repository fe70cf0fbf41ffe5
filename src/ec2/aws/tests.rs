use super::*;
use aws_config::{BehaviorVersion, Region};

#[test]
fn vpc_secondary_cidrs_are_associated_ones_without_the_primary() {
    let assoc = |cidr: &str, state: sdk::VpcCidrBlockStateCode| {
        sdk::VpcCidrBlockAssociation::builder()
            .cidr_block(cidr)
            .cidr_block_state(sdk::VpcCidrBlockState::builder().state(state).build())
            .build()
    };
    let v = sdk::Vpc::builder()
        .vpc_id("vpc-1")
        .cidr_block("10.0.0.0/16")
        .cidr_block_association_set(assoc("10.0.0.0/16", sdk::VpcCidrBlockStateCode::Associated))
        .cidr_block_association_set(assoc(
            "100.64.0.0/16",
            sdk::VpcCidrBlockStateCode::Associated,
        ))
        .cidr_block_association_set(assoc(
            "100.65.0.0/16",
            sdk::VpcCidrBlockStateCode::Disassociated,
        ))
        .build();
    let v = vpc(&v).expect("valid VPC");
    assert_eq!(v.primary_cidr, "10.0.0.0/16".parse::<Ipv4Net>().unwrap());
    assert_eq!(
        v.secondary_cidrs,
        vec!["100.64.0.0/16".parse::<Ipv4Net>().unwrap()]
    );
}

/// One address of an ENI as EC2 lists it.
fn addr(a: &str, primary: bool) -> sdk::NetworkInterfacePrivateIpAddress {
    sdk::NetworkInterfacePrivateIpAddress::builder()
        .private_ip_address(a)
        .primary(primary)
        .build()
}

#[test]
fn eni_conversion_lists_each_address_once() {
    // moto's CreateNetworkInterface can draw one address twice, or the primary again.
    let n = sdk::NetworkInterface::builder()
        .network_interface_id("eni-1")
        .private_ip_addresses(addr("10.0.0.5", true))
        .private_ip_addresses(addr("10.0.0.9", false))
        .private_ip_addresses(addr("10.0.0.5", false))
        .private_ip_addresses(addr("10.0.0.7", false))
        .private_ip_addresses(addr("10.0.0.9", false))
        .build();
    let eni = network_interface(&n);
    assert_eq!(eni.primary_ip, Ipv4Addr::new(10, 0, 0, 5));
    assert_eq!(
        eni.secondary_ips,
        vec![Ipv4Addr::new(10, 0, 0, 9), Ipv4Addr::new(10, 0, 0, 7)]
    );
}

#[test]
fn eni_conversion_splits_primary_from_secondaries() {
    let n = sdk::NetworkInterface::builder()
        .network_interface_id("eni-1")
        .private_ip_address("10.0.0.5")
        .private_ip_addresses(addr("10.0.0.9", false))
        .private_ip_addresses(addr("10.0.0.5", true))
        .ipv4_prefixes(
            sdk::Ipv4PrefixSpecification::builder()
                .ipv4_prefix("10.0.1.16/28")
                .build(),
        )
        .groups(sdk::GroupIdentifier::builder().group_id("sg-1").build())
        .tag_set(sdk::Tag::builder().key("k").value("v").build())
        .status(sdk::NetworkInterfaceStatus::InUse)
        .attachment(
            sdk::NetworkInterfaceAttachment::builder()
                .attachment_id("attach-1")
                .instance_id("i-1")
                .device_index(2)
                .delete_on_termination(true)
                .build(),
        )
        .association(
            sdk::NetworkInterfaceAssociation::builder()
                .public_ip("1.2.3.4")
                .build(),
        )
        .build();
    let eni = network_interface(&n);
    assert_eq!(eni.primary_ip, Ipv4Addr::new(10, 0, 0, 5));
    assert_eq!(eni.secondary_ips, vec![Ipv4Addr::new(10, 0, 0, 9)]);
    assert_eq!(
        eni.prefixes,
        vec!["10.0.1.16/28".parse::<Ipv4Net>().unwrap()]
    );
    assert_eq!(eni.security_groups, vec!["sg-1".to_string()]);
    assert_eq!(eni.tags.get("k").map(String::as_str), Some("v"));
    assert_eq!(eni.state, EniState::InUse);
    assert_eq!(eni.device_index(), Some(2));
    assert!(eni.attachment.as_ref().unwrap().delete_on_termination);
    assert_eq!(eni.public_ip.as_deref(), Some("1.2.3.4"));
}

/// Records every request body the SDK would send, then stops it before the network.
#[derive(Clone, Debug, Default)]
struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl aws_sdk_ec2::config::Intercept for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }

    fn read_before_transmit(
        &self,
        context: &aws_sdk_ec2::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _: &aws_sdk_ec2::config::RuntimeComponents,
        _: &mut aws_sdk_ec2::config::ConfigBag,
    ) -> std::result::Result<(), aws_sdk_ec2::error::BoxError> {
        let body = context.request().body().bytes().unwrap_or_default();
        self.0
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(body).into_owned());
        Err("recorded, not sent".into())
    }
}

fn recording_client(max_results: Option<i32>) -> (AwsEc2, Recorder) {
    let recorder = Recorder::default();
    let config = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(aws_sdk_ec2::config::Credentials::new(
            "a", "b", None, None, "test",
        ))
        .interceptor(recorder.clone())
        .build();
    let aws = AwsEc2 {
        client: Client::from_conf(config),
        max_results,
        credentials: None,
    };
    (aws, recorder)
}

impl Recorder {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[tokio::test]
async fn page_size_is_never_sent_with_ids() {
    let (aws, sent) = recording_client(Some(50));
    let by_vpc = EniFilter {
        vpc_id: Some("vpc-1".into()),
        ..Default::default()
    };
    let _ = aws.describe_network_interfaces(&by_vpc, None).await;
    let by_id = EniFilter {
        ids: vec!["eni-1".into()],
        ..Default::default()
    };
    let _ = aws.describe_network_interfaces(&by_id, None).await;
    let bodies = sent.take();
    assert!(bodies[0].contains("MaxResults=50"), "{}", bodies[0]);
    assert!(bodies[0].contains("Filter.1.Name=vpc-id"), "{}", bodies[0]);
    assert!(
        bodies[1].contains("NetworkInterfaceId.1=eni-1"),
        "{}",
        bodies[1]
    );
    assert!(!bodies[1].contains("MaxResults"), "{}", bodies[1]);
}

#[tokio::test]
async fn create_sends_everything_inline() {
    let (aws, sent) = recording_client(None);
    let mut request = CreateEniRequest {
        subnet_id: "subnet-1".into(),
        security_groups: vec!["sg-1".into()],
        description: "d".into(),
        tags: Tags::from([("k".to_string(), "v".to_string())]),
        addresses: AddressRequest::Ips(3),
        client_token: "tok".into(),
    };
    let _ = aws.create_network_interface(&request).await;
    request.addresses = AddressRequest::Prefixes(2);
    let _ = aws.create_network_interface(&request).await;
    request.addresses = AddressRequest::Ips(0);
    let _ = aws.create_network_interface(&request).await;
    let bodies = sent.take();
    for expected in [
        "SubnetId=subnet-1",
        "SecurityGroupId.1=sg-1",
        "Description=d",
        "ClientToken=tok",
        "TagSpecification.1.ResourceType=network-interface",
        "TagSpecification.1.Tag.1.Key=k",
        "TagSpecification.1.Tag.1.Value=v",
        "SecondaryPrivateIpAddressCount=3",
    ] {
        assert!(bodies[0].contains(expected), "{expected} in {}", bodies[0]);
    }
    assert!(!bodies[0].contains("Ipv4PrefixCount"));
    assert!(bodies[1].contains("Ipv4PrefixCount=2"), "{}", bodies[1]);
    assert!(!bodies[1].contains("SecondaryPrivateIpAddressCount"));
    assert!(
        !bodies[2].contains("SecondaryPrivateIpAddressCount"),
        "{}",
        bodies[2]
    );
    assert!(!bodies[2].contains("Ipv4PrefixCount"), "{}", bodies[2]);
}

#[tokio::test]
async fn attach_modify_and_unassign_requests() {
    let (aws, sent) = recording_client(None);
    let _ = aws.attach_network_interface("eni-1", "i-1", 2).await;
    let _ = aws
        .set_delete_on_termination("eni-1", "attach-1", true)
        .await;
    // Unassign stops at the first failed call; the recorder fails each, so send kinds apart.
    let ip = [Ipv4Addr::new(10, 0, 0, 9)];
    let prefix = ["10.0.1.16/28".parse::<Ipv4Net>().unwrap()];
    let _ = aws.unassign_private_ip_addresses("eni-1", &ip, &[]).await;
    let _ = aws
        .unassign_private_ip_addresses("eni-1", &[], &prefix)
        .await;
    let _ = aws.unassign_private_ip_addresses("eni-1", &[], &[]).await;
    let bodies = sent.take();
    assert_eq!(bodies.len(), 4, "no call for an empty unassign: {bodies:?}");
    for expected in ["DeviceIndex=2", "NetworkCardIndex=0", "InstanceId=i-1"] {
        assert!(bodies[0].contains(expected), "{expected} in {}", bodies[0]);
    }
    for expected in [
        "Attachment.AttachmentId=attach-1",
        "Attachment.DeleteOnTermination=true",
    ] {
        assert!(bodies[1].contains(expected), "{expected} in {}", bodies[1]);
    }
    assert!(
        bodies[2].contains("PrivateIpAddress.1=10.0.0.9"),
        "{}",
        bodies[2]
    );
    assert!(!bodies[2].contains("Ipv4Prefix.1"));
    assert!(
        bodies[3].contains("Ipv4Prefix.1=10.0.1.16%2F28"),
        "{}",
        bodies[3]
    );
    assert!(!bodies[3].contains("PrivateIpAddress.1"));
}
