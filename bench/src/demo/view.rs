//! The demo's terminal view of [`Figures`]: a live view redrawn in place by `indicatif` when
//! stdout is a terminal, plain lines every few seconds otherwise (CI, a pipe). Reads the
//! figures only; the text of both is [`lines`].

use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use testkit::agent::Generation;

use super::model::Figures;

/// Short names of the EC2 actions, in the order they are shown.
const ACTIONS: [(&str, &str); 7] = [
    ("DescribeNetworkInterfaces", "describe-eni"),
    ("DescribeInstances", "describe-inst"),
    ("CreateNetworkInterface", "create"),
    ("AttachNetworkInterface", "attach"),
    ("ModifyNetworkInterfaceAttribute", "modify"),
    ("AssignPrivateIpAddresses", "assign"),
    ("UnassignPrivateIpAddresses", "unassign"),
];

/// The status lines under the progress bar (and the plain output's block).
pub fn lines(f: &Figures) -> Vec<String> {
    let mut calls: Vec<String> = ACTIONS
        .iter()
        .filter(|(a, _)| f.calls_of(a) > 0)
        .map(|(a, short)| format!("{short} {}", f.calls_of(a)))
        .collect();
    let others: u64 = f
        .ec2
        .iter()
        .filter(|(a, _)| !ACTIONS.iter().any(|(k, _)| k == a))
        .map(|(_, c)| c.0)
        .sum();
    if others > 0 {
        calls.push(format!("other {others}"));
    }
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
            "EC2     {} calls: {}",
            f.calls(),
            if calls.is_empty() {
                "none".into()
            } else {
                calls.join(", ")
            }
        ),
        format!("        {} throttled answers", f.throttled()),
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
            ])),
        );
        let l = lines(&f);
        assert_eq!(l[0], "t =    7 s   wave 1 of 2 joined");
        assert_eq!(
            l[1],
            "nodes   2 joined (1 classic, 1 multi-pool): 1 served, 1 waiting"
        );
        assert_eq!(l[2], "pool    16 addresses on 2 ENIs");
        assert_eq!(l[3], "EC2     7 calls: create 4, unassign 2, other 1");
        assert_eq!(l[4], "        1 throttled answers");
        assert_eq!(l[5], "slowest a waited 7 s; waiting longest now: b for 7 s");
        assert_eq!(
            l[6],
            "release 3 ready-for-release answers, 2 unassign calls"
        );
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
