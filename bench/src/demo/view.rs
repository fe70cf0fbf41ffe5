//! The demo's terminal view of [`Figures`]: a live view redrawn in place by `indicatif` when
//! stdout is a terminal, plain lines every few seconds otherwise (CI, a pipe). Reads the
//! figures only; the text of both is [`lines`].

use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use testkit::agent::Generation;

use super::model::Figures;

/// Short names of the mutating EC2 actions, in the order they are shown; every describe is
/// summed as `describe`, anything else as `other`.
const ACTIONS: [(&str, &str); 7] = [
    ("CreateNetworkInterface", "create"),
    ("AttachNetworkInterface", "attach"),
    ("ModifyNetworkInterfaceAttribute", "modify"),
    ("AssignPrivateIpAddresses", "assign"),
    ("UnassignPrivateIpAddresses", "unassign"),
    ("DetachNetworkInterface", "detach"),
    ("DeleteNetworkInterface", "delete"),
];

/// The status lines under the progress bar (and the plain output's block), each within 80
/// columns at a few thousand nodes (a wrapped line would break the live view's redraw).
pub fn lines(f: &Figures) -> Vec<String> {
    let sum = |keep: &dyn Fn(&str) -> bool| -> u64 {
        f.ec2
            .iter()
            .filter(|(a, _)| keep(a))
            .map(|(_, c)| c.0)
            .sum()
    };
    let known = |a: &str| ACTIONS.iter().any(|(k, _)| *k == a);
    let mut calls: Vec<(&str, u64)> = ACTIONS
        .iter()
        .map(|(a, short)| (*short, f.calls_of(a)))
        .collect();
    calls.push(("describe", sum(&|a| a.starts_with("Describe"))));
    calls.push(("other", sum(&|a| !a.starts_with("Describe") && !known(a))));
    // Two rows: what adds capacity, then the rest.
    let row = |part: &[(&str, u64)]| {
        let shown: Vec<String> = part
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        format!(
            "        {}",
            if shown.is_empty() {
                "-".into()
            } else {
                shown.join(", ")
            }
        )
    };
    let slowest = f
        .slowest
        .as_ref()
        .map_or("-".into(), |(n, s)| format!("{n} waited {s:.0} s"));
    let now = f
        .longest_waiting()
        .map_or("none".into(), |(n, s)| format!("{n} for {s:.0} s"));
    vec![
        format!("t = {:>4.0} s   {}", f.now, f.phase),
        format!(
            "nodes   {} joined ({} classic, {} multi-pool): {} served, {} waiting",
            f.joined(),
            f.joined_of(Generation::Classic),
            f.joined_of(Generation::MultiPool),
            f.served(),
            f.waiting()
        ),
        format!("pool    {} addresses on {} ENIs", f.addresses(), f.enis()),
        format!(
            "EC2     {} calls, {} throttled answers",
            f.calls(),
            f.throttled()
        ),
        row(&calls[..4]),
        row(&calls[4..]),
        format!("slowest {slowest}; waiting longest now: {now}"),
        format!(
            "release {} ready-for-release answers, {} unassign calls",
            f.ready_answers,
            f.calls_of("UnassignPrivateIpAddresses")
        ),
    ]
}

/// Where the figures are shown while the demo runs.
pub trait View {
    fn show(&mut self, f: &Figures);
    /// The run ended: leave the last figures on screen.
    fn finish(&mut self, f: &Figures);
}

/// The live view: a bar of nodes served, the status lines below it.
pub struct Live {
    _multi: MultiProgress,
    bar: ProgressBar,
    rows: Vec<ProgressBar>,
}

impl Live {
    pub fn new(nodes: usize) -> Self {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
        let bar = multi.add(ProgressBar::new(nodes as u64));
        bar.set_style(
            ProgressStyle::with_template("served  [{bar:40.green/white}] {pos}/{len} {msg}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        let rows = (0..lines(&Figures::default()).len())
            .map(|_| {
                let row = multi.add(ProgressBar::new_spinner());
                row.set_style(ProgressStyle::with_template("{msg}").expect("a valid template"));
                row
            })
            .collect();
        Self {
            _multi: multi,
            bar,
            rows,
        }
    }
}

impl View for Live {
    fn show(&mut self, f: &Figures) {
        self.bar.set_position(f.served() as u64);
        self.bar.set_message(format!("({} joined)", f.joined()));
        for (row, line) in self.rows.iter().zip(lines(f)) {
            row.set_message(line);
        }
    }

    fn finish(&mut self, f: &Figures) {
        self.show(f);
        self.bar.abandon();
        for row in &self.rows {
            row.abandon();
        }
    }
}

/// Plain lines, one block every `every` seconds of the run.
pub struct Plain {
    every: f64,
    next: f64,
}

impl Plain {
    pub fn new(every: f64) -> Self {
        Self { every, next: 0.0 }
    }
}

impl View for Plain {
    fn show(&mut self, f: &Figures) {
        if f.now < self.next {
            return;
        }
        self.next = f.now + self.every;
        println!("{}", lines(f).join("\n  "));
    }

    fn finish(&mut self, f: &Figures) {
        println!("{}", lines(f).join("\n  "));
    }
}

/// The live view on a terminal, plain lines every `every` seconds otherwise.
pub fn for_stdout(nodes: usize, every: f64) -> Box<dyn View> {
    if std::io::stdout().is_terminal() {
        Box::new(Live::new(nodes))
    } else {
        Box::new(Plain::new(every))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::demo::model::Event;

    #[test]
    fn lines_show_nodes_pool_calls_throttling_and_the_slowest_node() {
        let mut f = Figures::default();
        f.apply(0.0, Event::Phase("wave 1 of 2 joined".into()));
        for (n, g) in [("a", Generation::Classic), ("b", Generation::MultiPool)] {
            f.apply(
                0.0,
                Event::Joined {
                    node: n.into(),
                    generation: g,
                },
            );
        }
        f.apply(
            7.0,
            Event::Looked {
                node: "a".into(),
                unsatisfied: 0,
                addresses: 16,
                enis: 2,
                ready_answers: 3,
            },
        );
        f.apply(
            7.0,
            Event::Ec2(BTreeMap::from([
                ("CreateNetworkInterface".into(), (4, 1)),
                ("UnassignPrivateIpAddresses".into(), (2, 0)),
                ("DescribeSubnets".into(), (1, 0)),
                ("DescribeNetworkInterfaces".into(), (3, 0)),
                ("CreateTags".into(), (1, 0)),
            ])),
        );
        let l = lines(&f);
        assert_eq!(l[0], "t =    7 s   wave 1 of 2 joined");
        assert_eq!(
            l[1],
            "nodes   2 joined (1 classic, 1 multi-pool): 1 served, 1 waiting"
        );
        assert_eq!(l[2], "pool    16 addresses on 2 ENIs");
        assert_eq!(l[3], "EC2     11 calls, 1 throttled answers");
        assert_eq!(l[4], "        create 4");
        assert_eq!(l[5], "        unassign 2, describe 4, other 1");
        assert_eq!(l[6], "slowest a waited 7 s; waiting longest now: b for 7 s");
        assert_eq!(
            l[7],
            "release 3 ready-for-release answers, 2 unassign calls"
        );
    }

    #[test]
    fn lines_fit_80_columns_at_a_few_thousand_nodes() {
        let mut f = Figures::default();
        let plan = crate::demo::plan::Plan::full();
        let longest = (0..plan.limit.as_secs())
            .map(|t| plan.phase_at(std::time::Duration::from_secs(t)))
            .max_by_key(|p| p.chars().count())
            .expect("phases");
        f.apply(0.0, Event::Phase(longest));
        for i in 0..3000 {
            let generation = if i % 3 == 0 {
                Generation::MultiPool
            } else {
                Generation::Classic
            };
            f.apply(
                0.0,
                Event::Joined {
                    node: format!("node-{i:04}"),
                    generation,
                },
            );
        }
        let mut calls: BTreeMap<String, (u64, u64)> = ACTIONS
            .iter()
            .map(|(a, _)| (a.to_string(), (99_999, 9_999)))
            .collect();
        calls.insert("DescribeNetworkInterfaces".into(), (99_999, 0));
        calls.insert("CreateTags".into(), (99_999, 0));
        f.apply(9999.0, Event::Ec2(calls));
        f.apply(
            9999.0,
            Event::Looked {
                node: "node-0001".into(),
                unsatisfied: 0,
                addresses: 99_999,
                enis: 9_999,
                ready_answers: 99_999,
            },
        );
        for l in lines(&f) {
            assert!(
                l.chars().count() <= 80,
                "{} columns: {l}",
                l.chars().count()
            );
        }
    }

    #[test]
    fn plain_output_skips_until_its_interval_has_passed() {
        let mut v = Plain::new(5.0);
        let mut f = Figures::default();
        v.show(&f);
        assert_eq!(v.next, 5.0);
        f.now = 3.0;
        v.show(&f);
        assert_eq!(v.next, 5.0, "not yet");
        f.now = 6.0;
        v.show(&f);
        assert_eq!(v.next, 11.0);
    }
}
