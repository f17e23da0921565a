//! Latency samples and their percentiles.

use std::time::Duration;

/// Latencies of one phase, in microseconds.
#[derive(Default)]
pub struct Latencies(Vec<u32>);

impl Latencies {
    /// Room for `n` samples.
    pub fn with_capacity(n: usize) -> Self {
        Latencies(Vec::with_capacity(n))
    }

    /// Adds one sample.
    pub fn record(&mut self, d: Duration) {
        self.0.push(d.as_micros().min(u32::MAX as u128) as u32);
    }

    /// Merges another set of samples.
    pub fn extend(&mut self, other: Latencies) {
        self.0.extend(other.0);
    }

    /// The `p`-th percentile (0..=100) in milliseconds; sorts the samples.
    pub fn percentile_ms(&mut self, p: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.sort_unstable();
        let rank = ((p / 100.0) * (self.0.len() - 1) as f64).round() as usize;
        self.0[rank.min(self.0.len() - 1)] as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_ranked_sample() {
        let mut l = Latencies::default();
        for us in (1..=100).rev() {
            l.record(Duration::from_micros(us * 1000));
        }
        assert_eq!(l.percentile_ms(50.0), 51.0);
        assert_eq!(l.percentile_ms(99.0), 99.0);
        assert_eq!(l.percentile_ms(100.0), 100.0);
        assert_eq!(Latencies::default().percentile_ms(99.0), 0.0);
    }
}
