use super::*;
use std::time::Duration;

fn obs(needed: i64, would: Would, enis: Vec<EniSeen>) -> Observation {
    Observation {
        figures: Figures {
            instance: "i-1".into(),
            mode: "classic".into(),
            needed,
            ..Figures::default()
        },
        would,
        error: None,
        enis: Some(enis),
    }
}

fn eni(id: &str, subnet: &str, sg: &str) -> EniSeen {
    EniSeen {
        id: id.into(),
        subnet: subnet.into(),
        security_groups: vec![sg.into()],
    }
}

#[test]
fn a_deficit_lasts_from_the_first_pass_that_sees_it_to_the_first_that_does_not() {
    let t0 = Instant::now();
    let mut s = NodeState::default();
    let create = Would::CreateEni {
        subnet: "subnet-a".into(),
        security_groups: vec!["sg-1".into()],
        addresses: 8,
    };
    let (d, _) = s.observe(obs(8, create.clone(), vec![]), t0);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].kind, Kind::WouldCreateEni);
    assert!(s.in_deficit);
    // The same plan again: no new disagreement.
    let (d, added) = s.observe(obs(8, create, vec![]), t0 + Duration::from_secs(3));
    assert!(d.is_empty());
    assert_eq!(added, 3.0);
    // The serving allocator attached an ENI in another subnet with the same group.
    let (d, added) = s.observe(
        obs(0, Would::Nothing, vec![eni("eni-1", "subnet-b", "sg-1")]),
        t0 + Duration::from_secs(5),
    );
    assert_eq!(added, 2.0);
    assert_eq!(
        d.iter().map(|d| d.kind).collect::<Vec<_>>(),
        vec![Kind::Subnet]
    );
    assert!(!s.in_deficit);
    assert_eq!(s.deficits, 1);
    assert_eq!(s.deficit_seconds, 5.0);
    assert_eq!(s.longest_deficit_seconds, 5.0);
    assert_eq!(s.enis_created_by_other, 1);
    assert_eq!(s.would_create_enis, 1);
    // Out of deficit, time no longer counts.
    let (_, added) = s.observe(
        obs(0, Would::Nothing, vec![eni("eni-1", "subnet-b", "sg-1")]),
        t0 + Duration::from_secs(60),
    );
    assert_eq!(added, 0.0);
    assert_eq!(s.deficit_seconds, 5.0);
}

#[test]
fn errors_releases_and_security_groups_are_disagreements_once_each() {
    let t0 = Instant::now();
    let mut s = NodeState::default();
    let mut o = obs(0, Would::Nothing, vec![]);
    o.error = Some("no subnet".into());
    assert_eq!(s.observe(o.clone(), t0).0.len(), 1);
    assert!(s.observe(o, t0).0.is_empty());
    let rel = Would::Release {
        eni: "eni-1".into(),
        addresses: 4,
    };
    assert_eq!(
        s.observe(obs(0, rel.clone(), vec![]), t0).0[0].kind,
        Kind::WouldRelease
    );
    assert!(s.observe(obs(0, rel, vec![]), t0).0.is_empty());
    assert_eq!(s.would_release_addresses, 4);
    s.our_choice = Some(("subnet-a".into(), vec!["sg-1".into()]));
    let (d, _) = s.observe(
        obs(0, Would::Nothing, vec![eni("eni-2", "subnet-a", "sg-2")]),
        t0,
    );
    assert_eq!(d[0].kind, Kind::SecurityGroups);
    assert_eq!(s.disagreements[&Kind::Error], 1);
    assert_eq!(s.disagreements[&Kind::SecurityGroups], 1);
}
