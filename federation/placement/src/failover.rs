//! How a workload leaves a shard that lost the federation (its agent's lease lapsed): the
//! two modes a Placement chooses between and how long each waits. Pure: the caller passes
//! the times, so every federation replica computes the same answer.
//!
//! - **Fast** (Deployments, ReplicaSets by default): replicas are stateless and may run twice
//!   for a while; the share on the lost shard is re-placed `delay` after the lease lapsed.
//! - **AtMostOnce** (Jobs, StatefulSets by default): the workload must never run in two
//!   shards at once. The cut-off shard's agent stops it on its own once its lease lapses
//!   (the agent's lease ends no later than the federation's, see the `Renewed` message);
//!   its pods then get their termination grace period. So the federation re-places it only
//!   after lease + grace + a margin for clock drift and the agent's reaction, or `delay` if
//!   that is longer.

use std::time::Duration;

/// A failover mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FailoverMode {
    /// Re-placed as soon as the lease lapses (plus the delay).
    #[default]
    Fast,
    /// Stopped by the shard first; re-placed after its pods' grace period and a margin.
    AtMostOnce,
}

impl FailoverMode {
    /// Its name as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            FailoverMode::Fast => "Fast",
            FailoverMode::AtMostOnce => "AtMostOnce",
        }
    }

    /// Reads the API's name (exact, as Kubernetes enums are).
    pub fn parse(s: &str) -> Option<FailoverMode> {
        match s {
            "Fast" => Some(FailoverMode::Fast),
            "AtMostOnce" => Some(FailoverMode::AtMostOnce),
            _ => None,
        }
    }
}

/// How one workload fails over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Failover {
    /// The mode.
    pub mode: FailoverMode,
    /// Extra wait after the lease lapsed (for AtMostOnce, the least wait).
    pub delay: Duration,
}

impl Failover {
    /// How long after the shard's lease ended its share of the workload may be placed
    /// elsewhere, for pods given `grace` to stop and a federation `margin` (clock drift,
    /// the agent's reaction time).
    pub fn wait(&self, grace: Duration, margin: Duration) -> Duration {
        match self.mode {
            FailoverMode::Fast => self.delay,
            FailoverMode::AtMostOnce => self.delay.max(grace.saturating_add(margin)),
        }
    }

    /// Whether the share may move now, `since_lease_end` after the shard's lease ended
    /// (`None`: the lease has not ended yet), and otherwise how long is left.
    pub fn due(
        &self,
        since_lease_end: Option<Duration>,
        grace: Duration,
        margin: Duration,
    ) -> Result<(), Option<Duration>> {
        let Some(since) = since_lease_end else {
            return Err(None);
        };
        let wait = self.wait(grace, margin);
        if since >= wait {
            Ok(())
        } else {
            Err(Some(wait - since))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// (mode, delay, grace, margin, since the lease ended, expected), in seconds.
    type Case = (
        FailoverMode,
        u64,
        u64,
        u64,
        Option<u64>,
        Result<(), Option<u64>>,
    );

    #[test]
    fn each_mode_waits_as_documented() {
        let table: &[Case] = &[
            // The lease has not ended: nothing moves, whatever the mode.
            (FailoverMode::Fast, 0, 30, 5, None, Err(None)),
            (FailoverMode::AtMostOnce, 0, 30, 5, None, Err(None)),
            // Fast moves at the lapse, or after its delay.
            (FailoverMode::Fast, 0, 30, 5, Some(0), Ok(())),
            (FailoverMode::Fast, 10, 30, 5, Some(4), Err(Some(6))),
            (FailoverMode::Fast, 10, 30, 5, Some(10), Ok(())),
            // AtMostOnce waits the pods' grace and the margin...
            (FailoverMode::AtMostOnce, 0, 30, 5, Some(34), Err(Some(1))),
            (FailoverMode::AtMostOnce, 0, 30, 5, Some(35), Ok(())),
            (FailoverMode::AtMostOnce, 0, 0, 5, Some(5), Ok(())),
            // ...or its delay, if longer; a shorter delay cannot cut the wait.
            (FailoverMode::AtMostOnce, 60, 30, 5, Some(40), Err(Some(20))),
            (FailoverMode::AtMostOnce, 1, 30, 5, Some(1), Err(Some(34))),
        ];
        for &(mode, delay, grace, margin, since, want) in table {
            let f = Failover {
                mode,
                delay: S(delay),
            };
            let got = f.due(since.map(S), S(grace), S(margin));
            assert_eq!(
                got,
                want.map_err(|left| left.map(S)),
                "{mode:?} delay {delay} grace {grace} margin {margin} since {since:?}"
            );
        }
    }

    #[test]
    fn names_round_trip_and_others_are_refused() {
        for m in [FailoverMode::Fast, FailoverMode::AtMostOnce] {
            assert_eq!(FailoverMode::parse(m.as_str()), Some(m));
        }
        assert_eq!(FailoverMode::parse("atmostonce"), None);
        assert_eq!(FailoverMode::parse(""), None);
    }
}
