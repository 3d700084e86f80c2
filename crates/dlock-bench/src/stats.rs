//! Summaries of measured samples: percentiles, min / median / max over runs, Jain's index.

use serde::{Deserialize, Serialize};

/// One number measured several times.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Spread {
    /// Smallest run.
    pub min: f64,
    /// Median run.
    pub median: f64,
    /// Largest run.
    pub max: f64,
}

impl Spread {
    /// The min, median and max of `values` (NaN for none).
    pub fn of(mut values: Vec<f64>) -> Spread {
        values.sort_by(f64::total_cmp);
        let pick = |i: usize| values.get(i).copied().unwrap_or(f64::NAN);
        Spread {
            min: pick(0),
            median: pick(values.len() / 2),
            max: pick(values.len().saturating_sub(1)),
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>10.1} (min {:.1}, max {:.1})",
            self.median, self.min, self.max
        )
    }
}

/// The `p` quantile (0..=1) of sorted samples, nearest rank.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Latencies in µs → (pairs/s over the time spent, p50, p99).
pub(crate) fn summarize(mut latencies: Vec<f64>) -> (f64, f64, f64) {
    let spent_s: f64 = latencies.iter().sum::<f64>() / 1e6;
    latencies.sort_by(f64::total_cmp);
    (
        latencies.len() as f64 / spent_s,
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
    )
}

/// The distribution of sorted samples as [`QUANTILES`] points, for charts.
pub(crate) fn quantiles(sorted: &[f64]) -> Vec<f64> {
    QUANTILES.iter().map(|&q| percentile(sorted, q)).collect()
}

/// Where a distribution is sampled: every percent, with the tail in finer steps.
pub const QUANTILES: &[f64] = &[
    0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7,
    0.75, 0.8, 0.85, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99, 0.995, 0.999, 1.0,
];

/// Jain's fairness index of per-worker counts: 1 when even, 1/n when one worker got all.
pub(crate) fn jain(counts: &[f64]) -> f64 {
    let sum: f64 = counts.iter().sum();
    let squares: f64 = counts.iter().map(|c| c * c).sum();
    sum * sum / (counts.len() as f64 * squares)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_picks_min_median_max() {
        let s = Spread::of(vec![3.0, 1.0, 2.0]);
        assert_eq!((s.min, s.median, s.max), (1.0, 2.0, 3.0));
    }

    #[test]
    fn jain_is_one_when_even_and_one_over_n_when_one_takes_all() {
        assert!((jain(&[5.0, 5.0, 5.0, 5.0]) - 1.0).abs() < 1e-9);
        assert!((jain(&[8.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-9);
    }
}
