//! The adaptive rate and the throttle penalty: cuts, pacing, order under scarcity, recovery.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_throttled_answer_cuts_the_rate_of_its_bucket_only() {
    let fake = Fake::failing(Operation::AttachNetworkInterface, "RequestLimitExceeded", 1);
    let g = gate(fake, GateConfig::aws_defaults());
    let ceiling = |b| g.config().bucket_limits(b).1;
    g.attach_network_interface("eni-1", "i-1", 1).await.unwrap();
    // Cut by the SDK's beta from what was sent (one call in the measuring window), on its way
    // back (the retry waited for the restore probe 2 s later).
    let general = rate_of(&g, Bucket::AttachNetworkInterface);
    let sent = 1.0 / rate::MEASURE.as_secs_f64();
    let cut = ceiling(Bucket::AttachNetworkInterface).min(sent) * rate::BETA;
    assert!(
        general > cut && general < ceiling(Bucket::AttachNetworkInterface) * rate::BETA,
        "{general} vs {cut}"
    );
    for b in Bucket::ALL {
        if b != Bucket::AttachNetworkInterface {
            assert_eq!(rate_of(&g, b), ceiling(b), "{b:?} is independent");
        }
    }
}

/// A gate whose delete bucket (80 burst, 4/s) was cut three times just after ten calls went
/// out (so the cuts start from the ceiling), with no penalty: only the pacing spaces the calls.
async fn cut_three_times() -> Arc<Gate<Fake>> {
    let config = GateConfig {
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(1),
        ..GateConfig::aws_defaults()
    };
    let g = gate(Fake::default(), config);
    for _ in 0..10 {
        g.delete_network_interface("eni-1").await.unwrap();
    }
    g.inner()
        .fail(Operation::DeleteNetworkInterface, "RequestLimitExceeded", 3);
    g.delete_network_interface("eni-1").await.unwrap();
    g
}

/// `n` deletes at once; the instants of the deletes sent after `after` (all of them).
async fn concurrent_deletes(g: &Arc<Gate<Fake>>, n: usize, after: Instant) -> Vec<Instant> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let g = g.clone();
            tokio::spawn(async move { g.delete_network_interface("eni-2").await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let times: Vec<Instant> = g
        .inner()
        .times(Some(Operation::DeleteNetworkInterface))
        .into_iter()
        .filter(|t| *t > after)
        .collect();
    assert_eq!(times.len(), n);
    times
}

#[tokio::test(start_paused = true)]
async fn below_the_ceiling_calls_are_paced_at_the_learned_rate() {
    let g = cut_three_times().await;
    let rate = rate_of(&g, Bucket::DeleteNetworkInterface);
    assert!(rate < 4.0 * 0.35, "three cuts from 4/s: {rate}");
    // Thirty concurrent deletes: one every 1/rate, not the burst of 80 the ceiling allows,
    // until the restore probe 2 s after the first cut takes the rate back to the ceiling.
    let start = Instant::now();
    let times = concurrent_deletes(&g, 30, start).await;
    let gap = 1.0 / rate;
    let first = [times[0] - start, times[1] - times[0]];
    for d in first {
        let d = d.as_secs_f64();
        assert!(d >= gap * 0.99 && d <= gap * 1.01, "{first:?} at {rate}/s");
    }
    let span = (*times.iter().max().unwrap() - start).as_secs_f64();
    assert!(
        span < 15.0,
        "30 calls over {span} s: the probe restored the ceiling (22 s at {rate}/s)"
    );
    assert_eq!(rate_of(&g, Bucket::DeleteNetworkInterface), 4.0);
}

#[tokio::test(start_paused = true)]
async fn new_work_yields_the_next_slot_to_half_done_work() {
    // One bucket for everything (Cilium's mode), throttled once: scarcity. Its floor (1/s) is
    // the rate after the cut, and the calls below are done before the probe's ramp gets back
    // to the ceiling (100/s).
    let fake = Fake::failing(Operation::DescribeVpcs, "RequestLimitExceeded", 1);
    let config = GateConfig {
        single_bucket: Some((100.0, 1)),
        ..GateConfig::aws_defaults()
    };
    let g = gate(fake, config);
    // Throttled, then retried: the rate is cut. Then queue creates first and attaches after.
    g.describe_vpcs(&ResourceFilter::default(), None)
        .await
        .unwrap();
    assert!(g.rates()[0].1 < 100.0);
    let mut tasks = Vec::new();
    for i in 0..3 {
        let g = g.clone();
        tasks.push(tokio::spawn(async move {
            g.create_network_interface(&create_request())
                .await
                .map(|_| ())
        }));
        tokio::time::sleep(Duration::from_millis(1 + i)).await;
    }
    for _ in 0..3 {
        let g = g.clone();
        tasks.push(tokio::spawn(async move {
            g.attach_network_interface("eni-1", "i-1", 1)
                .await
                .map(|_| ())
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let log = g.inner().log.lock().unwrap().clone();
    let order: Vec<Operation> = log.iter().skip(2).map(|(op, _)| *op).collect();
    assert_eq!(
        order,
        [
            [Operation::AttachNetworkInterface; 3],
            [Operation::CreateNetworkInterface; 3]
        ]
        .concat(),
        "attaches that complete work go before new creates, although queued later"
    );
}

#[tokio::test(start_paused = true)]
async fn calls_of_an_urgent_pass_take_the_next_slot_before_reserves() {
    // One token a second and nobody else in the account: the ceiling, no scarcity.
    let config = GateConfig {
        overrides: [(Bucket::CreateNetworkInterface, (1, 1.0))].into(),
        ..GateConfig::aws_defaults()
    };
    let g = gate(Fake::default(), config);
    let served = Arc::new(Mutex::new(Vec::new()));
    let create = |urgent: bool| {
        let (g, served) = (g.clone(), served.clone());
        tokio::spawn(urgency::scope(urgent, async move {
            g.create_network_interface(&create_request()).await.unwrap();
            served.lock().unwrap().push(urgent);
        }))
    };
    // Three reserves wait first (one takes the token at once), then two passes for first
    // addresses.
    let mut tasks: Vec<_> = (0..3).map(|_| create(false)).collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    tasks.extend((0..2).map(|_| create(true)));
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        *served.lock().unwrap(),
        [false, true, true, false, false],
        "the urgent creates go next, although they came after the reserves"
    );
}

#[tokio::test(start_paused = true)]
async fn a_throttled_answer_slows_the_whole_bucket() {
    let fake = Fake::failing(Operation::AttachNetworkInterface, "RequestLimitExceeded", 1);
    let g = gate(fake, GateConfig::aws_defaults());
    let start = Instant::now();
    let throttled = {
        let g = g.clone();
        tokio::spawn(async move { g.attach_network_interface("eni-1", "i-1", 1).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Another attach waits out the penalty although tokens are plentiful. Detach has a bucket
    // of its own (AWS's buckets are per action) and goes at once.
    let (attach, detach) = tokio::join!(
        g.attach_network_interface("eni-3", "i-3", 1),
        g.detach_network_interface("eni-attach-1", false),
    );
    attach.unwrap();
    detach.unwrap();
    throttled.await.unwrap().unwrap();
    let attaches = g.inner().times(Some(Operation::AttachNetworkInterface));
    let at = |op| g.inner().times(Some(op))[0].duration_since(start);
    assert!(
        attaches
            .iter()
            .skip(1)
            .all(|t| t.duration_since(start) >= Duration::from_millis(200)),
        "{attaches:?}"
    );
    assert_eq!(
        at(Operation::DetachNetworkInterface),
        Duration::from_millis(10)
    );
}

/// Every delete throttled from now until `until` (a spell of another tenant), then all
/// answered.
async fn spell(g: &Arc<Gate<Fake>>, until: Instant) {
    g.inner().fail(
        Operation::DeleteNetworkInterface,
        "RequestLimitExceeded",
        100_000,
    );
    tokio::time::sleep_until(until).await;
    g.inner().script.lock().unwrap().clear();
}

#[tokio::test(start_paused = true)]
async fn the_rate_is_back_at_the_ceiling_soon_after_a_spell_ends() {
    let g = gate(Fake::default(), GateConfig::aws_defaults());
    let start = Instant::now();
    let end = start + Duration::from_secs(20);
    // A backlog of deletes throughout; every answer throttled for 20 s.
    let spell_task = {
        let g = g.clone();
        tokio::spawn(async move { spell(&g, end).await })
    };
    tokio::task::yield_now().await;
    let tasks: Vec<_> = (0..400)
        .map(|_| {
            let g = g.clone();
            tokio::spawn(async move { g.delete_network_interface("eni-1").await })
        })
        .collect();
    spell_task.await.unwrap();
    let low = rate_of(&g, Bucket::DeleteNetworkInterface);
    assert!(low < 0.5, "the spell cut the rate: {low}");
    let mut back = None;
    while back.is_none() && Instant::now() < end + Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if rate_of(&g, Bucket::DeleteNetworkInterface) == 4.0 {
            back = Some(Instant::now() - end);
        }
    }
    // Growth by successes alone takes over a thousand calls from the floor.
    let back = back.expect("back at the ceiling within 120 s");
    assert!(
        back <= Duration::from_secs(20),
        "back at the ceiling {back:?} after the spell"
    );
    for t in tasks {
        t.await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn tokens_saved_while_paced_do_not_go_out_at_once() {
    let g = gate(Fake::default(), GateConfig::aws_defaults());
    // Ten calls from the burst of 80, then one throttled answer: the account's bucket is empty.
    for _ in 0..10 {
        g.delete_network_interface("eni-1").await.unwrap();
    }
    g.inner()
        .fail(Operation::DeleteNetworkInterface, "RequestLimitExceeded", 1);
    g.delete_network_interface("eni-1").await.unwrap();
    let throttled = Instant::now();
    let times = concurrent_deletes(&g, 200, throttled).await;
    // Never more than the ceiling's 4 calls a second (and a token of rounding) from then on:
    // the 69 tokens left in the burst went with the throttled answer.
    assert_within_rate(times, 2, 4.0);
    assert_eq!(rate_of(&g, Bucket::DeleteNetworkInterface), 4.0);
}
