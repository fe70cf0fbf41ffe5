//! `make demo`: the operator doing its job with nothing else installed. Nodes join in waves
//! (classic and multi-pool agents), their demand rises and falls (the release handshake), the
//! account is throttled for a while; a live view shows the figures, and the run ends with a
//! summary and a plot of nodes served against the rate-limit bound.
//!
//! * [`plan`]: the script and the bound;
//! * [`model`]: the figures, a pure model fed by events;
//! * [`view`]: the terminal view of the figures;
//! * [`served`]: when every node is served again after the rise, ours and the bound's;
//! * [`drive`]: the loop that plays the script against a back-end and feeds the model;
//! * [`memory`]: the in-memory back-end (the operator's core, the simulator, the in-memory API
//!   server, as `make bench`);
//! * [`real`]: the real processes (the operator binary, a control plane, ec2-sim, as
//!   `make bench-process`).

pub mod drive;
pub mod memory;
pub mod model;
pub mod plan;
pub mod real;
pub mod served;
pub mod view;

use serde_json::json;

use crate::plot;
use drive::Outcome;
use testkit::agent::Generation;

/// The summary printed at the end.
pub fn summary(o: &Outcome, backend: &str) -> Vec<String> {
    let f = &o.figures;
    let slowest = f
        .slowest
        .as_ref()
        .map_or("-".into(), |(n, s)| format!("{n}, {s:.0} s"));
    let calls: Vec<String> = f.ec2.iter().map(|(a, (n, _))| format!("{a} {n}")).collect();
    vec![
        format!(
            "demo ({backend}): {} nodes ({} classic, {} multi-pool) served; done after {:.0} s",
            f.joined(),
            f.joined_of(Generation::Classic),
            f.joined_of(Generation::MultiPool),
            o.took.as_secs_f64()
        ),
        format!(
            "pool at the end: {} addresses on {} ENIs",
            f.addresses(),
            f.enis()
        ),
        format!(
            "EC2: {} calls ({}), {} throttled answers",
            f.calls(),
            calls.join(", "),
            f.throttled()
        ),
        format!(
            "release handshake: {} ready-for-release answers, {} unassign calls",
            f.ready_answers,
            f.calls_of("UnassignPrivateIpAddresses")
        ),
        format!("slowest node to be served: {slowest}"),
        o.after_rise().map_or(
            "after the demand rise: not every node served again".into(),
            |a| a.line(),
        ),
    ]
}

/// The figures the test reads (`--json`).
pub fn summary_json(o: &Outcome, backend: &str) -> serde_json::Value {
    let f = &o.figures;
    json!({
        "backend": backend,
        "seconds": o.took.as_secs_f64(),
        "joined": f.joined(),
        "classic": f.joined_of(Generation::Classic),
        "multi_pool": f.joined_of(Generation::MultiPool),
        "served": f.served(),
        "waiting": f.waiting(),
        "addresses": f.addresses(),
        "enis": f.enis(),
        "calls": f.ec2.iter().map(|(a, (n, t))| (a.clone(), json!({"calls": n, "throttled": t}))).collect::<serde_json::Map<_, _>>(),
        "throttled": f.throttled(),
        "ready_answers": f.ready_answers,
        "slowest": f.slowest.as_ref().map(|(n, s)| json!({"node": n, "seconds": s})),
        "after_rise": o.after_rise().map(|a| json!({
            "rise": a.rise, "ours": a.ours, "bound": a.bound, "ratio": a.ratio()
        })),
    })
}

/// The plot: nodes served over the run against the rate-limit bound.
pub fn plot_svg(o: &Outcome, seconds: &str) -> anyhow::Result<String> {
    let served = o.figures.served_curve.clone();
    plot::svg(
        (900, 450),
        seconds,
        "nodes served",
        &[
            plot::Series {
                name: "nodes served",
                color: [31, 119, 180],
                points: &served,
            },
            plot::Series {
                name: "rate-limit bound (AWS's buckets)",
                color: [127, 127, 127],
                points: &o.bound,
            },
        ],
    )
}
