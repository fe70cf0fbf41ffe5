//! The pure parts of the real-process benchmark (`make bench-process`,
//! `src/bin/bench-process.rs`): reading the API server's `apiserver_request_total`, ec2-sim's
//! `/_sim/stats`, `/proc/PID/{stat,status}` and `/proc/loadavg`, percentiles, and the result
//! block written into docs/benchmarks.md. The binary does the I/O.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// One series of `apiserver_request_total`, without the answer code (summed over codes).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    pub verb: String,
    pub resource: String,
    pub subresource: String,
}

impl RequestKey {
    /// `PATCH ciliumnodes/status`, `LIST nodes`.
    pub fn label(&self) -> String {
        if self.subresource.is_empty() {
            format!("{} {}", self.verb, self.resource)
        } else {
            format!("{} {}/{}", self.verb, self.resource, self.subresource)
        }
    }

    /// Verbs that change an object.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE" | "DELETECOLLECTION"
        )
    }
}

/// Request counts by series.
pub type Requests = BTreeMap<RequestKey, u64>;

/// The labels of one Prometheus text-format sample line (`name{a="x",b="y"} value`), with
/// `\"`, `\\` and `\n` unescaped. `None` if the line is not a sample of `name`.
fn sample<'a>(line: &'a str, name: &str) -> Option<(BTreeMap<String, String>, &'a str)> {
    let rest = line.strip_prefix(name)?;
    let mut labels = BTreeMap::new();
    let rest = if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices();
        let mut key = String::new();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => break i,
                ',' | ' ' => {}
                '=' => {
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                other => key.push(other),
            }
        };
        &body[end + 1..]
    } else if rest.starts_with(' ') {
        rest
    } else {
        // Another metric whose name starts with `name`.
        return None;
    };
    let value = rest.split_whitespace().next()?;
    Some((labels, value))
}

/// `apiserver_request_total` from the API server's `/metrics` text, summed over answer codes
/// (and versions, scopes, components), by verb, resource and subresource.
pub fn parse_apiserver_requests(text: &str) -> Requests {
    let mut out = Requests::new();
    for line in text.lines() {
        let Some((labels, value)) = sample(line, "apiserver_request_total") else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
        let key = RequestKey {
            verb: get("verb"),
            resource: get("resource"),
            subresource: get("subresource"),
        };
        *out.entry(key).or_default() += v as u64;
    }
    out
}

/// `after - before`, dropping series that did not move.
pub fn requests_between(before: &Requests, after: &Requests) -> Requests {
    after
        .iter()
        .filter_map(|(k, a)| {
            let d = a.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// The series of `resources` only, as `VERB resource[/sub] N` joined by `, `, largest first.
pub fn requests_summary(r: &Requests, resources: &[&str]) -> String {
    let mut v: Vec<(&RequestKey, &u64)> = r
        .iter()
        .filter(|(k, _)| resources.contains(&k.resource.as_str()))
        .collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    if v.is_empty() {
        return "none".into();
    }
    v.iter()
        .map(|(k, n)| format!("{} {n}", k.label()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Writes (create, update, patch, delete) to `resource` in `r`.
pub fn writes_to(r: &Requests, resource: &str) -> u64 {
    r.iter()
        .filter(|(k, _)| k.resource == resource && k.is_write())
        .map(|(_, n)| n)
        .sum()
}

/// ec2-sim's `/_sim/stats` per action: (calls, throttled, failed). Failed answers are the
/// rejected ones (an EC2 error code other than throttling) and the injected faults.
pub type Ec2Calls = BTreeMap<String, (u64, u64, u64)>;

/// Reads `{"ops": {ACTION: {"calls": n, "throttled": n, "rejected": n, "faults": n, ...}}}`.
pub fn parse_sim_stats(v: &serde_json::Value) -> Ec2Calls {
    v["ops"]
        .as_object()
        .map(|ops| {
            ops.iter()
                .map(|(name, c)| {
                    let n = |k: &str| c[k].as_u64().unwrap_or(0);
                    (
                        name.clone(),
                        (n("calls"), n("throttled"), n("rejected") + n("faults")),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Per-action difference of two stats readings, dropping actions without calls.
pub fn ec2_between(before: &Ec2Calls, after: &Ec2Calls) -> Ec2Calls {
    after
        .iter()
        .filter_map(|(k, (c, t, f))| {
            let (c0, t0, f0) = before.get(k).copied().unwrap_or((0, 0, 0));
            let d = (
                c.saturating_sub(c0),
                t.saturating_sub(t0),
                f.saturating_sub(f0),
            );
            (d.0 > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Mutating actions (every action the simulator counts except the describes).
pub fn ec2_mutating(c: &Ec2Calls) -> u64 {
    c.iter()
        .filter(|(k, _)| !k.starts_with("Describe"))
        .map(|(_, (n, _, _))| n)
        .sum()
}

/// Throttled and failed answers over every action.
pub fn ec2_refused(c: &Ec2Calls) -> (u64, u64) {
    c.values()
        .fold((0, 0), |(t, f), (_, t1, f1)| (t + t1, f + f1))
}

pub fn ec2_summary(c: &Ec2Calls) -> String {
    if c.is_empty() {
        return "none".into();
    }
    c.iter()
        .map(|(k, (n, t, f))| match (*t, *f) {
            (0, 0) => format!("{k} {n}"),
            (t, 0) => format!("{k} {n} ({t} throttled)"),
            (0, f) => format!("{k} {n} ({f} failed)"),
            (t, f) => format!("{k} {n} ({t} throttled, {f} failed)"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// CPU ticks (utime + stime, fields 14 and 15) from `/proc/PID/stat`. The command name (field
/// 2) is in parentheses and may hold spaces: fields are counted after its closing parenthesis.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state): utime is field 14, stime 15.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A `kB` line of `/proc/PID/status` (`VmRSS`, `VmHWM`) in MiB.
pub fn parse_status_mib(status: &str, key: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.split(':').next() == Some(key))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The state letter of `/proc/PID/status` (`R`, `S`, `Z` for a zombie, ...).
pub fn parse_status_state(status: &str) -> Option<char> {
    let line = status.lines().find(|l| l.starts_with("State:"))?;
    line["State:".len()..].trim_start().chars().next()
}

/// The three load averages of `/proc/loadavg`.
pub fn parse_loadavg(s: &str) -> Option<[f64; 3]> {
    let mut it = s.split_whitespace().map(|x| x.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// Nearest-rank percentile (`p` in 0..=100) of `samples`; `None` when empty.
pub fn percentile(samples: &[Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

/// Load of the machine over a run: first, last, mean and max of the 1-minute average.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Load {
    pub samples: Vec<f64>,
}

impl Load {
    pub fn push(&mut self, one_minute: f64) {
        self.samples.push(one_minute);
    }

    /// `mean 1.9, max 2.4 (1-min loadavg, 2 cores)`.
    pub fn describe(&self, cores: usize) -> String {
        if self.samples.is_empty() {
            return "not sampled".into();
        }
        let mean = self.samples.iter().sum::<f64>() / self.samples.len() as f64;
        let max = self.samples.iter().copied().fold(f64::MIN, f64::max);
        format!("1-min loadavg mean {mean:.2}, max {max:.2} on {cores} cores")
    }
}

/// CPU of a process over a window: seconds, and the average in cores.
pub fn cpu_share(ticks: u64, ticks_per_second: u64, window: Duration) -> (f64, f64) {
    let secs = ticks as f64 / ticks_per_second.max(1) as f64;
    let w = window.as_secs_f64();
    (secs, if w > 0.0 { secs / w } else { 0.0 })
}

/// The figures of one real-process run (one table row).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessRow {
    /// Which operator served the nodes (ours, or Cilium's with its rate limit).
    pub operator: String,
    pub mode: String,
    pub nodes: usize,
    /// Until every node's demand was met (or the limit).
    pub time: Duration,
    pub met: bool,
    pub bound: Duration,
    pub peak_rss_mib: f64,
    pub steady_rss_mib: f64,
    /// Operator CPU (seconds, average cores) in the burst and in steady state.
    pub cpu_burst: (f64, f64),
    pub cpu_steady: (f64, f64),
    /// New-node time to usable addresses, p50 and p99: quiet cluster, during the burst.
    pub quiet: (Option<Duration>, Option<Duration>),
    pub during_burst: (Option<Duration>, Option<Duration>),
    /// Steady state: the operator's CiliumNode writes and mutating EC2 calls.
    pub steady_writes: u64,
    pub steady_mutating: u64,
    /// The burst's nodes: time from their CiliumNode's create to their first address, p50,
    /// p99 and max.
    pub first_address: [Option<Duration>; 3],
    /// Burst: EC2 calls, of them mutating, throttled and failed answers.
    pub calls: u64,
    pub mutating: u64,
    pub throttled: u64,
    pub failed: u64,
    /// Burst: the operator's CiliumNode writes per node.
    pub cn_writes_per_node: f64,
    /// The machine's load during the burst.
    pub load: String,
}

impl ProcessRow {
    pub fn ratio(&self) -> f64 {
        self.time.as_secs_f64() / self.bound.as_secs_f64().max(1e-9)
    }
}

fn pair(p: (Option<Duration>, Option<Duration>)) -> String {
    let f = |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.2} s", d.as_secs_f64()));
    format!("{} / {}", f(p.0), f(p.1))
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

/// Runs as one Markdown table (header and a row per run), side by side.
pub fn process_table(rows: &[ProcessRow]) -> String {
    let mut t = String::from(
        "| operator | scenario | nodes | demand met | lower bound | ratio | first address p50 / p99 / max \
         | EC2 calls (mutating) | throttled / failed | CiliumNode writes per node | peak RSS \
         | steady RSS | CPU burst | CPU steady | new node usable p50 / p99, quiet | same, during the \
         burst | steady writes / mutating calls | machine load (burst) |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            t,
            "| {} | real process, burst, {}, AWS buckets | {} | {:.1} s{} | {:.1} s | {:.2}x \
             | {} / {} / {} | {} ({}) | {} / {} | {:.1} | {:.0} MiB | {:.0} MiB \
             | {:.1} s ({:.2} cores) | {:.1} s ({:.3} cores) | {} | {} | {} / {} | {} |",
            r.operator,
            r.mode,
            r.nodes,
            r.time.as_secs_f64(),
            if r.met { "" } else { " (not met)" },
            r.bound.as_secs_f64(),
            r.ratio(),
            secs(r.first_address[0]),
            secs(r.first_address[1]),
            secs(r.first_address[2]),
            r.calls,
            r.mutating,
            r.throttled,
            r.failed,
            r.cn_writes_per_node,
            r.peak_rss_mib,
            r.steady_rss_mib,
            r.cpu_burst.0,
            r.cpu_burst.1,
            r.cpu_steady.0,
            r.cpu_steady.1,
            pair(r.quiet),
            pair(r.during_burst),
            r.steady_writes,
            r.steady_mutating,
            r.load,
        );
    }
    t
}

/// The text of every `<tag>…</tag>` element in `xml`, in order, each value once (EC2 answers
/// repeat an instance's id inside its network interfaces' attachments).
pub fn xml_values(xml: &str, tag: &str) -> Vec<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let mut out: Vec<String> = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        rest = &rest[i + open.len()..];
        let Some(j) = rest.find(&close) else { break };
        let v = rest[..j].trim();
        if !out.iter().any(|o| o == v) {
            out.push(v.to_owned());
        }
        rest = &rest[j + close.len()..];
    }
    out
}

/// Replace the block between `<!-- bench:process:KEY:begin -->` and its end marker; without
/// one, insert it before `<!-- bench:process:end -->`, or append it.
pub fn splice_block(doc: &str, key: &str, block: &str) -> String {
    let begin = format!("<!-- bench:process:{key}:begin -->");
    let end = format!("<!-- bench:process:{key}:end -->");
    let framed = format!("{begin}\n{block}{end}\n");
    if let (Some(b), Some(e)) = (doc.find(&begin), doc.find(&end))
        && b < e
    {
        let after = &doc[e + end.len()..];
        let after = after.strip_prefix('\n').unwrap_or(after);
        return format!("{}{framed}{after}", &doc[..b]);
    }
    const ALL_END: &str = "<!-- bench:process:end -->";
    if let Some(i) = doc.find(ALL_END) {
        return format!("{}{framed}{}", &doc[..i], &doc[i..]);
    }
    let mut out = doc.to_owned();
    if !out.ends_with('\n') {
        out.push('\n');
    }
    let _ = write!(out, "{framed}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="cilium.io",resource="ciliumnodes",scope="resource",subresource="status",verb="PATCH",version="v2"} 120
apiserver_request_total{code="409",component="apiserver",dry_run="",group="cilium.io",resource="ciliumnodes",scope="resource",subresource="status",verb="PATCH",version="v2"} 3
apiserver_request_total{code="201",component="apiserver",dry_run="",group="cilium.io",resource="ciliumnodes",scope="resource",subresource="",verb="POST",version="v2"} 100
apiserver_request_total{code="0",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="WATCH",version="v1"} 2
apiserver_request_total_extra{code="200",verb="GET"} 99
apiserver_request_duration_seconds_bucket{verb="GET",le="0.1"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="od\"d",scope="cluster",subresource="",verb="GET",version="v1"} 1.5e+01
"#;

    #[test]
    fn apiserver_requests_sum_codes_and_keep_verb_resource_subresource() {
        let r = parse_apiserver_requests(METRICS);
        let key = |verb: &str, res: &str, sub: &str| RequestKey {
            verb: verb.into(),
            resource: res.into(),
            subresource: sub.into(),
        };
        assert_eq!(r[&key("PATCH", "ciliumnodes", "status")], 123);
        assert_eq!(r[&key("POST", "ciliumnodes", "")], 100);
        assert_eq!(r[&key("WATCH", "nodes", "")], 2);
        assert_eq!(r[&key("GET", "od\"d", "")], 15, "escapes and exponents");
        assert_eq!(
            r.len(),
            4,
            "other metrics with the same prefix are not counted"
        );
        assert_eq!(writes_to(&r, "ciliumnodes"), 223);
        assert_eq!(writes_to(&r, "nodes"), 0);
        assert_eq!(
            requests_summary(&r, &["ciliumnodes"]),
            "PATCH ciliumnodes/status 123, POST ciliumnodes 100"
        );
    }

    #[test]
    fn request_window_drops_series_that_did_not_move() {
        let before = parse_apiserver_requests(METRICS);
        let mut after = before.clone();
        let k = RequestKey {
            verb: "WATCH".into(),
            resource: "nodes".into(),
            subresource: String::new(),
        };
        *after.get_mut(&k).unwrap() += 5;
        let d = requests_between(&before, &after);
        assert_eq!(d.len(), 1);
        assert_eq!(d[&k], 5);
        assert_eq!(requests_summary(&d, &["ciliumnodes"]), "none");
    }

    #[test]
    fn sim_stats_window_and_mutating_calls() {
        let before = parse_sim_stats(&serde_json::json!({
            "total": {"calls": 10},
            "ops": {
                "DescribeNetworkInterfaces": {"calls": 4, "throttled": 0},
                "CreateNetworkInterface": {"calls": 6, "throttled": 1},
            }
        }));
        let after = parse_sim_stats(&serde_json::json!({
            "ops": {
                "DescribeNetworkInterfaces": {"calls": 7, "throttled": 0},
                "CreateNetworkInterface": {"calls": 6, "throttled": 1},
                "AttachNetworkInterface": {"calls": 2, "throttled": 2},
                "AssignPrivateIpAddresses": {"calls": 3, "rejected": 1, "faults": 1},
            }
        }));
        let d = ec2_between(&before, &after);
        assert_eq!(d.len(), 3, "{d:?}");
        assert_eq!(d["DescribeNetworkInterfaces"], (3, 0, 0));
        assert_eq!(d["AssignPrivateIpAddresses"], (3, 0, 2));
        assert_eq!(ec2_mutating(&d), 5);
        assert_eq!(ec2_refused(&d), (2, 2));
        assert_eq!(
            ec2_summary(&d),
            "AssignPrivateIpAddresses 3 (2 failed), AttachNetworkInterface 2 (2 throttled), DescribeNetworkInterfaces 3"
        );
    }

    #[test]
    fn proc_files_parse() {
        // The command name may hold spaces and parentheses.
        let stat =
            "4242 (eni (op) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_stat_ticks(stat), Some(325));
        let status = "Name:\teni-operator\nVmHWM:\t  153600 kB\nVmRSS:\t   51200 kB\n";
        assert_eq!(parse_status_mib(status, "VmHWM"), Some(150.0));
        assert_eq!(parse_status_mib(status, "VmRSS"), Some(50.0));
        assert_eq!(parse_status_mib(status, "VmSwap"), None);
        assert_eq!(parse_status_state(status), None);
        assert_eq!(
            parse_status_state("Name:\tcilium-operator\nState:\tZ (zombie)\n"),
            Some('Z')
        );
        assert_eq!(parse_status_state("State:\tS (sleeping)\n"), Some('S'));
        assert_eq!(
            parse_loadavg("1.50 0.75 0.25 3/120 999\n"),
            Some([1.5, 0.75, 0.25])
        );
        assert_eq!(parse_loadavg("x"), None);
        assert_eq!(cpu_share(150, 100, Duration::from_secs(10)), (1.5, 0.15));
    }

    #[test]
    fn nearest_rank_percentiles() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|m| Duration::from_millis(*m))
                .collect::<Vec<_>>()
        };
        let s = ms(&[900, 100, 500, 300, 700, 200, 400, 600, 800, 1000]);
        assert_eq!(percentile(&s, 50.0), Some(Duration::from_millis(500)));
        assert_eq!(percentile(&s, 99.0), Some(Duration::from_millis(1000)));
        assert_eq!(percentile(&s, 0.0), Some(Duration::from_millis(100)));
        assert_eq!(
            percentile(&ms(&[42]), 99.0),
            Some(Duration::from_millis(42))
        );
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn load_describes_mean_and_max() {
        let mut l = Load::default();
        assert_eq!(l.describe(2), "not sampled");
        l.push(1.0);
        l.push(3.0);
        assert_eq!(
            l.describe(2),
            "1-min loadavg mean 2.00, max 3.00 on 2 cores"
        );
    }

    #[test]
    fn process_table_has_header_and_row_of_the_same_width() {
        let r = ProcessRow {
            operator: "ours".into(),
            mode: "secondary IPs".into(),
            nodes: 1000,
            time: Duration::from_secs(650),
            met: true,
            bound: Duration::from_secs_f64(591.05),
            peak_rss_mib: 80.4,
            steady_rss_mib: 60.0,
            cpu_burst: (120.0, 0.18),
            cpu_steady: (1.3, 0.008),
            quiet: (
                Some(Duration::from_millis(1100)),
                Some(Duration::from_millis(1400)),
            ),
            during_burst: (None, None),
            steady_writes: 0,
            steady_mutating: 0,
            first_address: [
                Some(Duration::from_millis(2_500)),
                Some(Duration::from_secs(40)),
                None,
            ],
            calls: 9_100,
            mutating: 9_000,
            throttled: 3,
            failed: 0,
            cn_writes_per_node: 7.04,
            load: "1-min loadavg mean 2.00".into(),
        };
        let cilium = ProcessRow {
            operator: "Cilium 1.20".into(),
            met: false,
            ..r.clone()
        };
        let t = process_table(&[r, cilium]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        let cols = |l: &str| l.matches('|').count();
        assert_eq!(cols(lines[0]), cols(lines[1]));
        for l in &lines[2..] {
            assert_eq!(cols(lines[0]), cols(l), "{t}");
        }
        assert!(lines[2].starts_with("| ours |"), "{t}");
        assert!(lines[2].contains("| 1.10x |"), "{t}");
        assert!(lines[2].contains("| 2.5 s / 40.0 s / - |"), "{t}");
        assert!(lines[2].contains("| 9100 (9000) | 3 / 0 | 7.0 |"), "{t}");
        assert!(lines[2].contains("| 1.10 s / 1.40 s | - / - |"), "{t}");
        assert!(lines[2].contains("| 0 / 0 |"), "{t}");
        assert!(!lines[2].contains("not met"));
        assert!(lines[3].starts_with("| Cilium 1.20 |"), "{t}");
        assert!(lines[3].contains("650.0 s (not met)"), "{t}");
    }

    #[test]
    fn xml_values_in_order_once_each() {
        let xml = "<r><instancesSet><item><instanceId>i-1</instanceId><networkInterfaceSet><item>\
            <attachment><instanceId>i-1</instanceId></attachment></item></networkInterfaceSet>\
            </item><item><instanceId> i-2 </instanceId></item></instancesSet></r>";
        assert_eq!(xml_values(xml, "instanceId"), vec!["i-1", "i-2"]);
        assert!(xml_values(xml, "vpcId").is_empty());
        assert!(xml_values("<vpcId>unclosed", "vpcId").is_empty());
    }

    #[test]
    fn blocks_are_replaced_in_place_or_inserted_before_the_end_marker() {
        let doc = "intro\n<!-- bench:process:end -->\nafter\n";
        let one = splice_block(doc, "a", "row a\n");
        assert_eq!(
            one,
            "intro\n<!-- bench:process:a:begin -->\nrow a\n<!-- bench:process:a:end -->\n<!-- bench:process:end -->\nafter\n"
        );
        let two = splice_block(&one, "b", "row b\n");
        let again = splice_block(&two, "a", "row a2\n");
        assert!(again.contains("row a2\n"), "{again}");
        assert!(!again.contains("row a\n"), "{again}");
        assert!(
            again.find("row a2").unwrap() < again.find("row b").unwrap(),
            "a stays where it was: {again}"
        );
        assert!(again.ends_with("<!-- bench:process:end -->\nafter\n"));
        assert_eq!(
            splice_block("x", "c", "y\n"),
            "x\n<!-- bench:process:c:begin -->\ny\n<!-- bench:process:c:end -->\n"
        );
    }
}
