use super::*;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * b.abs().max(1.0)
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// A controller at `ceiling` that sent `n` calls evenly over the last [`MEASURE`] before
/// `t0`, so the measured rate is `n / 2` per second.
fn sending(ceiling: f64, n: u32, t0: Instant) -> RateController {
    let mut c = RateController::new(ceiling, t0);
    for i in 0..n {
        c.on_send(t0 - MEASURE + MEASURE * (i + 1) / (n + 1));
    }
    c
}

#[test]
fn starts_at_the_ceiling_without_limiting() {
    let c = RateController::new(4.0, Instant::now());
    assert_eq!(c.rate(), 4.0);
    assert!(!c.is_limiting());
    assert_eq!(c.next_change(Instant::now()), None);
}

#[test]
fn a_throttled_answer_cuts_the_rate_by_beta() {
    let t0 = Instant::now();
    let mut c = sending(4.0, 20, t0);
    assert!(c.on_throttle(t0, t0 + secs(0.3)));
    assert!(close(c.rate(), 2.8), "{}", c.rate());
    assert!(c.is_limiting());
    // A call sent after the cut and throttled again cuts again.
    assert!(c.on_throttle(t0 + secs(0.4), t0 + secs(0.7)));
    assert!(close(c.rate(), 4.0 * 0.7 * 0.7), "{}", c.rate());
}

#[test]
fn a_cut_starts_from_the_measured_send_rate_when_lower() {
    let t0 = Instant::now();
    // One call a second against a ceiling of 4: the cut lands below what was sent.
    let mut c = sending(4.0, 2, t0);
    c.on_send(t0);
    assert!(c.on_throttle(t0, t0 + secs(0.3)));
    assert!(close(c.rate(), 1.5 * BETA), "{}", c.rate());
}

#[test]
fn calls_in_flight_at_the_cut_do_not_cut_again() {
    let t0 = Instant::now();
    let mut c = sending(4.0, 20, t0);
    let later = t0 + secs(0.1);
    assert!(c.on_throttle(t0, t0 + secs(0.4)));
    // `later` was sent before the cut: its answer reflects the old rate.
    assert!(!c.on_throttle(later, t0 + secs(0.4)));
    assert!(close(c.rate(), 2.8), "{}", c.rate());
}

#[test]
fn successes_regain_a_cut_after_regain_calls() {
    let t0 = Instant::now();
    let mut c = sending(10.0, 40, t0);
    c.on_throttle(t0, t0);
    assert!(close(c.rate(), 7.0));
    // Within the first probe's delay: only the successes move the rate.
    let t = t0 + secs(1.0);
    for _ in 0..50 {
        c.on_success(t);
    }
    // Halfway in calls, geometric: 7 × (1/0.7)^0.5.
    assert!(close(c.rate(), 7.0 / 0.7f64.sqrt()), "{}", c.rate());
    for _ in 0..49 {
        c.on_success(t);
    }
    assert!(c.is_limiting(), "one call short of regaining the cut");
    c.on_success(t);
    assert!(close(c.rate(), 10.0), "{}", c.rate());
    assert_eq!(c.next_change(t), None, "no probe due at the ceiling");
}

#[test]
fn a_throttled_answer_after_a_steady_stretch_cuts_shallow_and_regains_in_regain_calls() {
    let t0 = Instant::now();
    let mut c = sending(10.0, 40, t0);
    c.on_throttle(t0, t0);
    assert!(
        close(c.rate(), 7.0),
        "a fresh controller cuts deep: {}",
        c.rate()
    );
    // Within the first probe's delay: only the cuts and successes move the rate.
    let t = t0 + secs(1.0);
    for _ in 0..STEADY_CALLS {
        c.on_success(t);
    }
    let before = c.rate();
    let t = t0 + secs(1.5);
    // Sent at the learned rate or above: the cut starts from the rate.
    for _ in 0..20 {
        c.on_send(t);
    }
    assert!(c.on_throttle(t, t));
    // 0.9x, not the SDK's 0.7x: the dip under the share stays small.
    assert!(
        close(c.rate(), before * 0.9),
        "a steady stretch ends with a shallow cut: {} from {before}",
        c.rate()
    );
    // The cut is regained in as many successes as a deep one.
    for _ in 0..99 {
        c.on_success(t);
    }
    assert!(c.rate() < before, "one call short: {}", c.rate());
    c.on_success(t);
    assert!(close(c.rate(), before), "{} vs {before}", c.rate());
    // Another steady stretch ends: shallow again; a call sent after that cut and throttled
    // too means the share fell: cut deep.
    let t = t0 + secs(1.8);
    c.on_send(t);
    assert!(c.on_throttle(t, t));
    assert!(close(c.rate(), before * BETA_STEADY), "{}", c.rate());
    let shallow = c.rate();
    let t = t0 + secs(1.9);
    c.on_send(t);
    assert!(c.on_throttle(t, t));
    assert!(
        close(c.rate(), shallow * BETA),
        "{} from {shallow}",
        c.rate()
    );
}

#[test]
fn growth_stops_at_the_ceiling() {
    let t0 = Instant::now();
    let mut c = sending(5.0, 20, t0);
    for _ in 0..1000 {
        c.on_success(t0);
    }
    assert_eq!(c.rate(), 5.0);
    c.on_throttle(t0, t0);
    for _ in 0..1000 {
        c.on_success(t0 + secs(1.0));
    }
    assert_eq!(c.rate(), 5.0);
    assert!(!c.is_limiting());
}

#[test]
fn cuts_stop_at_the_floor() {
    let t0 = Instant::now();
    let mut c = sending(4.0, 20, t0);
    for i in 0..100 {
        let t = t0 + secs(f64::from(i) * 0.001);
        c.on_throttle(t, t);
    }
    assert!(close(c.rate(), 4.0 * FLOOR_FRACTION), "{}", c.rate());
}

/// Cut to the floor at `t0` (as in a spell), with the first probe due at `t0 + 2 s`.
fn at_the_floor(ceiling: f64, t0: Instant) -> RateController {
    let mut c = sending(ceiling, 20, t0);
    for i in 0..40 {
        let t = t0 + secs(f64::from(i) * 0.001);
        c.on_throttle(t, t);
    }
    assert!(close(c.rate(), ceiling * FLOOR_FRACTION), "{}", c.rate());
    c
}

#[test]
fn a_probe_two_seconds_after_a_cut_ramps_to_the_ceiling_doubling_each_second() {
    let t0 = Instant::now();
    let mut c = at_the_floor(4.0, t0);
    // Later cuts did not put off the probe due 2 s after the first.
    assert_eq!(c.next_change(t0), Some(FIRST_PROBE));
    c.advance(t0 + secs(1.9));
    assert!(close(c.rate(), 0.04), "no probe before its time");
    let start = t0 + FIRST_PROBE;
    c.advance(start);
    c.advance(start + secs(3.0));
    assert!(close(c.rate(), 0.04 * 8.0), "{}", c.rate());
    // 0.04 × 2^t reaches 4 after log2(100) = 6.64 s.
    c.advance(start + secs(6.6));
    assert!(c.is_limiting());
    c.advance(start + secs(6.7));
    assert_eq!(c.rate(), 4.0);
    assert_eq!(c.recoveries(), 1);
    assert_eq!(c.next_change(start + secs(7.0)), None);
}

#[test]
fn a_throttled_answer_during_the_probe_returns_to_the_saved_rate_and_doubles_the_interval() {
    // A ceiling of 400: the floor (4/s) is above a cut of what the probe sent (0.5/s).
    let t0 = Instant::now();
    let mut c = at_the_floor(400.0, t0);
    let mut probe = t0 + FIRST_PROBE;
    let mut interval = FIRST_PROBE;
    let mut delays = Vec::new();
    for _ in 0..23 {
        c.advance(probe);
        let t = probe + secs(2.0);
        c.advance(t);
        assert!(close(c.rate(), 16.0), "ramping: {}", c.rate());
        assert!(c.on_throttle(t, t + secs(0.3)));
        assert!(close(c.rate(), 4.0), "back to the saved rate: {}", c.rate());
        let next = c.next_change(t + secs(0.3)).expect("a probe is due");
        delays.push(next.as_secs());
        let early = t + secs(0.3) < t0 + EARLY_PHASE;
        let cap = if early {
            EARLY_INTERVAL
        } else {
            MAX_PROBE_INTERVAL
        };
        interval = (interval * 2).min(cap);
        assert_eq!(next, interval);
        probe = t + secs(0.3) + next;
    }
    // A probe every 10.3 s (8 s and the 2.3 s ramp) until the early phase is over.
    let mut expected = vec![4];
    expected.extend([8; 14]);
    expected.extend([16, 32, 64, 128, 256, 512, 600, 600]);
    assert_eq!(
        delays, expected,
        "doubling up to 8 s in the early phase, then up to the cap"
    );
    assert_eq!(c.recoveries(), 0);
}

/// Drives `c` from `t0` until `end`, in steps of 50 ms: the account leaves `left(t)` calls
/// a second, and a rate above it is answered "throttled" (one answer per step); with
/// `succeed`, calls at a rate within it are sent and succeed. Returns when the rate reached
/// the ceiling after `from`, and the rate changes by throttled answers.
fn drive(
    c: &mut RateController,
    t0: Instant,
    (from, end): (Duration, Duration),
    succeed: bool,
    left: impl Fn(Duration) -> f64,
) -> (Option<Duration>, u32) {
    let mut cuts = 0;
    let mut credit = 0.0;
    let mut t = Duration::ZERO;
    while t < end {
        c.advance(t0 + t);
        if c.rate() > left(t) {
            if c.on_throttle(t0 + t, t0 + t) {
                cuts += 1;
            }
        } else if succeed {
            credit += c.rate() * 0.05;
            while credit >= 1.0 {
                credit -= 1.0;
                c.on_send(t0 + t);
                c.on_success(t0 + t);
            }
        }
        if t >= from && !c.is_limiting() {
            return (Some(t), cuts);
        }
        t += secs(0.05);
    }
    (None, cuts)
}

#[test]
fn a_spell_of_two_minutes_is_found_over_within_seconds() {
    // Another tenant leaves 10 % of the ceiling for D; the rate must be back at the ceiling
    // within the early interval and the ramp after the end, wherever the end falls.
    for d in [20.0, 60.0, 95.0, 120.0, 133.0] {
        let t0 = Instant::now();
        let mut c = at_the_floor(5.0, t0);
        let end = secs(d);
        let (back, _) = drive(&mut c, t0, (end, end + secs(60.0)), true, |t| {
            if t < end { 0.5 } else { 5.0 }
        });
        let back = back.expect("back at the ceiling");
        assert!(
            back - end <= EARLY_INTERVAL + secs(4.0),
            "a spell of {d} s: back {:?} after its end",
            back - end
        );
    }
}

#[test]
fn a_share_held_for_an_hour_costs_few_failed_probes() {
    // The early phase costs its probes once; after it the interval doubles to the cap.
    let t0 = Instant::now();
    let mut c = at_the_floor(5.0, t0);
    let (back, cuts) = drive(&mut c, t0, (secs(0.0), secs(3600.0)), false, |_| 0.5);
    assert_eq!(back, None);
    assert!(cuts <= 30, "{cuts} failed probes in an hour");
}

#[test]
fn a_probe_throttled_below_the_ceiling_keeps_a_cut_of_what_it_sent() {
    // A tenant took 90 % and now takes half: the ramp finds the new share.
    let t0 = Instant::now();
    let mut c = at_the_floor(5.0, t0);
    let start = t0 + FIRST_PROBE;
    c.advance(start);
    // Three calls a second went through the ramp's last two seconds.
    for i in 0..6 {
        c.on_send(start + secs(4.1 + f64::from(i) / 3.0));
    }
    let t = start + secs(6.0);
    assert!(c.on_throttle(t, t));
    assert!(close(c.rate(), 3.0 * BETA), "{}", c.rate());
    assert_eq!(c.next_change(t), Some(FIRST_PROBE * 2));
}

#[test]
fn a_probe_failing_at_the_level_of_the_last_returns_to_the_saved_rate() {
    // A steady share of 0.5/s: each ramp spends the few tokens the account's bucket saved
    // and is throttled at about the same send rate as the last. A cut of that rate would
    // sit above the share and cost two more throttled answers each time.
    let t0 = Instant::now();
    let mut c = at_the_floor(4.0, t0);
    let mut probe = t0 + FIRST_PROBE;
    for i in 0..4 {
        c.advance(probe);
        let saved = c.rate();
        // Three calls went through the ramp's last two seconds: 1.5/s, three times the share.
        for i in 0..3 {
            c.on_send(probe + secs(0.5 + f64::from(i) * 0.6));
        }
        let t = probe + secs(2.0);
        c.advance(t);
        assert!(c.on_throttle(t, t));
        if i == 0 {
            // The first failure has none to compare with: a cut of what it sent.
            assert!(close(c.rate(), 1.5 * BETA), "{}", c.rate());
        } else {
            assert!(
                close(c.rate(), saved),
                "back to the saved rate {saved}, not {}",
                c.rate()
            );
        }
        // The rate above the share is cut before the next probe.
        let cut = t + secs(1.0);
        c.on_send(cut);
        assert!(c.on_throttle(cut, cut));
        probe = cut + c.next_change(cut).expect("a probe is due");
    }
}

#[test]
fn a_throttled_answer_soon_after_a_probe_reached_the_ceiling_returns_to_its_saved_rate() {
    // A steady share of 0.4/s: a probe after a long interval reaches the ceiling on the
    // tokens the account's bucket saved, and the bucket is empty a round trip later.
    let t0 = Instant::now();
    let mut c = at_the_floor(4.0, t0);
    let start = t0 + FIRST_PROBE;
    c.advance(start);
    let saved = c.rate();
    let reached = start + secs(6.7);
    c.advance(reached);
    assert_eq!(c.rate(), 4.0, "the probe reached the ceiling");
    let interval = c.next_change(reached);
    assert_eq!(interval, None);
    // The saved tokens went out at the ceiling.
    for i in 0..8 {
        c.on_send(reached + secs(f64::from(i) * 0.25));
    }
    let t = reached + secs(2.0);
    assert!(c.on_throttle(t, t + secs(0.3)));
    assert!(
        close(c.rate(), saved),
        "back to the probe's saved rate {saved}, not a cut from the ceiling: {}",
        c.rate()
    );
    // Counted as a failed probe: the next one after the doubled interval.
    assert_eq!(c.next_change(t + secs(0.3)), Some(FIRST_PROBE * 2));
    // Later throttled answers cut from there as usual.
    let later = t + secs(1.0);
    c.on_send(later);
    assert!(c.on_throttle(later, later));
    assert!(close(c.rate(), (saved * BETA).max(0.04)), "{}", c.rate());
}

#[test]
fn a_throttled_answer_long_after_a_probe_reached_the_ceiling_cuts_as_usual() {
    let t0 = Instant::now();
    let mut c = at_the_floor(4.0, t0);
    let start = t0 + FIRST_PROBE;
    c.advance(start);
    c.advance(start + secs(6.7));
    assert_eq!(c.rate(), 4.0);
    let t = start + secs(60.0);
    c.advance(t);
    for i in 0..8 {
        c.on_send(t - secs(f64::from(i) * 0.25));
    }
    assert!(c.on_throttle(t, t));
    assert!(close(c.rate(), 4.0 * BETA), "{}", c.rate());
}

#[test]
fn two_minutes_at_the_ceiling_reset_the_interval() {
    let t0 = Instant::now();
    let mut c = at_the_floor(4.0, t0);
    // One failed probe: the next is 4 s after it.
    c.advance(t0 + secs(2.0));
    c.on_throttle(t0 + secs(2.5), t0 + secs(3.0));
    // The second succeeds.
    let start = t0 + secs(7.0);
    c.advance(start);
    c.advance(start + secs(7.0));
    assert!(!c.is_limiting());
    // Cut again soon after: the ceiling was reached but not held, so the interval doubled
    // as after a failed probe.
    let t = start + secs(60.0);
    c.on_throttle(t, t);
    assert_eq!(c.next_change(t), Some(secs(8.0)));
    // Recovered and held for two minutes: back to the first interval.
    let start = t + secs(8.0);
    c.advance(start);
    c.advance(start + secs(4.0));
    assert!(!c.is_limiting());
    c.advance(start + secs(4.0) + RESET_AFTER);
    let t = start + secs(200.0);
    c.on_throttle(t, t);
    assert_eq!(c.next_change(t), Some(FIRST_PROBE));
}
