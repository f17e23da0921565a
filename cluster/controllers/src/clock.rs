//! The controllers' wall clock: a seam, so that a test can move to the second before a
//! CronJob's next minute instead of waiting for it. Durations between events come from
//! `tokio::time` as everywhere else; only "what time is it" (a schedule) reads this.

use std::sync::atomic::{AtomicI64, Ordering};

use jiff::{SignedDuration, Timestamp};

/// What time it is.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// The system's clock moved by an offset that can be changed (tests).
#[derive(Debug, Default)]
pub struct OffsetClock {
    offset_ms: AtomicI64,
}

impl OffsetClock {
    /// Moves the clock so that it reads `at` now (and runs on from there).
    pub fn set(&self, at: Timestamp) {
        let offset = at.duration_since(Timestamp::now());
        self.offset_ms
            .store(offset.as_millis() as i64, Ordering::SeqCst);
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> Timestamp {
        let offset = SignedDuration::from_millis(self.offset_ms.load(Ordering::SeqCst));
        Timestamp::now()
            .checked_add(offset)
            .unwrap_or_else(|_| Timestamp::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_clock_reads_what_it_was_set_to_and_runs_on() {
        let clock = OffsetClock::default();
        let target: Timestamp = "2030-01-01T00:00:59Z".parse().expect("time");
        clock.set(target);
        let read = clock.now();
        let drift = read.duration_since(target).as_millis();
        assert!((0..1_000).contains(&drift), "{drift} ms");
        assert!(SystemClock.now() < target);
    }
}
