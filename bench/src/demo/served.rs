//! When every node is served again after the demand rises, for our curve and the bound's, so
//! the demo's summary states the ratio instead of leaving it to the eye on the plot.

/// The first sample at or after `from` at which `curve` (seconds, nodes served) holds all
/// `total` nodes again after having dropped below it (the rise makes nodes wait; a curve that
/// never drops is served at its first sample from `from`). `None`: never all served again.
pub fn all_served_after(curve: &[(f64, f64)], from: f64, total: usize) -> Option<f64> {
    let total = total as f64;
    let mut later = curve.iter().filter(|(t, _)| *t >= from).peekable();
    let first = *later.peek()?;
    if first.1 >= total && !curve.iter().any(|(t, n)| *t >= from && *n < total) {
        return Some(first.0);
    }
    later
        .skip_while(|(_, n)| *n >= total)
        .find(|(_, n)| *n >= total)
        .map(|(t, _)| *t)
}

/// Ours against the bound: both all-served times (seconds from the start) and their ratio.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AfterRise {
    pub rise: f64,
    pub bound: f64,
    pub ours: f64,
}

impl AfterRise {
    pub fn of(ours: &[(f64, f64)], bound: &[(f64, f64)], rise: f64, total: usize) -> Option<Self> {
        Some(Self {
            rise,
            bound: all_served_after(bound, rise, total)?,
            ours: all_served_after(ours, rise, total)?,
        })
    }

    /// Ours over the bound, both counted from the start of the run (the 1.10x target).
    pub fn ratio(&self) -> f64 {
        self.ours / self.bound
    }

    pub fn line(&self) -> String {
        format!(
            "after the demand rise at {:.0} s: every node served at {:.0} s, the rate-limit bound \
             at {:.0} s: {:.2}x ({:.0} s against {:.0} s after the rise)",
            self.rise,
            self.ours,
            self.bound,
            self.ratio(),
            self.ours - self.rise,
            self.bound - self.rise
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(points: &[(u32, u32)]) -> Vec<(f64, f64)> {
        points
            .iter()
            .map(|(t, n)| (f64::from(*t), f64::from(*n)))
            .collect()
    }

    #[test]
    fn all_served_is_the_first_full_sample_after_the_dip() {
        // Full before the rise, a dip at it, full again at 150 and after.
        let c = curve(&[(100, 10), (110, 4), (130, 8), (150, 10), (160, 10)]);
        assert_eq!(all_served_after(&c, 110.0, 10), Some(150.0));
        // The bound lags one chain: still full at the rise sample, dips after it.
        let b = curve(&[(110, 10), (111, 2), (140, 10)]);
        assert_eq!(all_served_after(&b, 110.0, 10), Some(140.0));
    }

    #[test]
    fn never_dipping_is_served_at_once_and_never_full_is_none() {
        let c = curve(&[(100, 10), (110, 10), (120, 10)]);
        assert_eq!(all_served_after(&c, 110.0, 10), Some(110.0));
        let c = curve(&[(110, 3), (120, 9)]);
        assert_eq!(all_served_after(&c, 110.0, 10), None);
        assert_eq!(all_served_after(&[], 110.0, 10), None);
    }

    #[test]
    fn the_ratio_counts_from_the_start() {
        let ours = curve(&[(110, 4), (165, 10)]);
        let bound = curve(&[(110, 10), (111, 0), (150, 10)]);
        let a = AfterRise::of(&ours, &bound, 110.0, 10).expect("both served");
        assert_eq!((a.ours, a.bound), (165.0, 150.0));
        assert!((a.ratio() - 1.1).abs() < 1e-9);
        assert!(a.line().contains("1.10x"), "{}", a.line());
        assert!(a.line().contains("55 s against 40 s"), "{}", a.line());
    }
}
