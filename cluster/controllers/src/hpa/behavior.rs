//! From the replicas the metrics ask for to the replicas set, as Kubernetes' HPA controller
//! goes: a stabilization window (the highest recommendation of the last window when scaling
//! down, the lowest when scaling up), then rate limits — without `behavior`, at most double
//! (or 4) per step and the bounds; with it, each direction's policies over their periods,
//! counting the changes already made in each period.
//!
//! Times are milliseconds on the controllers' clock, so tests can move through windows.

/// One rate policy: at most `value` pods, or `value` percent, per `period_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Pods (true) or Percent.
    pub pods: bool,
    /// How many pods or what percentage.
    pub value: i64,
    /// Over how long.
    pub period_ms: i64,
}

/// How the policies of one direction combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Select {
    /// The policy allowing the most change.
    Max,
    /// The policy allowing the least change.
    Min,
    /// No change in this direction.
    Disabled,
}

/// One direction's rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    /// The stabilization window.
    pub window_ms: i64,
    /// How the policies combine.
    pub select: Select,
    /// The policies.
    pub policies: Vec<Policy>,
}

/// What limited the replicas, for the `ScalingLimited` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Nothing.
    WithinRange,
    /// `maxReplicas`.
    TooMany,
    /// `minReplicas`.
    TooFew,
    /// The scale-up rate.
    ScaleUpRate,
    /// The scale-down rate.
    ScaleDownRate,
}

impl Limit {
    /// The condition's reason and message.
    pub fn reason(self) -> (&'static str, &'static str) {
        match self {
            Limit::WithinRange => (
                "DesiredWithinRange",
                "the desired count is within the acceptable range",
            ),
            Limit::TooMany => (
                "TooManyReplicas",
                "the desired replica count is more than the maximum replica count",
            ),
            Limit::TooFew => (
                "TooFewReplicas",
                "the desired replica count is less than the minimum replica count",
            ),
            Limit::ScaleUpRate => (
                "ScaleUpLimit",
                "the desired replica count is increasing faster than the maximum scale rate",
            ),
            Limit::ScaleDownRate => (
                "ScaleDownLimit",
                "the desired replica count is decreasing faster than the maximum scale rate",
            ),
        }
    }
}

/// How a stabilization window changed a recommendation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stabilized {
    /// It did not.
    No,
    /// A higher recent recommendation held a scale-down back.
    Down,
    /// A lower recent recommendation held a scale-up back.
    Up,
}

/// What one HPA's normalization remembers between syncs.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// (time, recommended replicas).
    recommendations: Vec<(i64, i32)>,
    /// (time, pods added).
    ups: Vec<(i64, i32)>,
    /// (time, pods removed).
    downs: Vec<(i64, i32)>,
}

/// The outcome of a normalization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Normalized {
    /// The replicas to set.
    pub replicas: i32,
    /// What the stabilization window did.
    pub stabilized: Stabilized,
    /// What limited the result.
    pub limit: Limit,
}

/// Bounds of an HPA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// `minReplicas`.
    pub min: i32,
    /// `maxReplicas`.
    pub max: i32,
}

impl History {
    /// Without `behavior`: the highest recommendation of the last `down_window_ms` (this one
    /// included), then at most max(2 × current, 4) and the bounds.
    pub fn normalize(
        &mut self,
        now: i64,
        current: i32,
        desired: i32,
        bounds: Bounds,
        down_window_ms: i64,
    ) -> Normalized {
        let cutoff = now - down_window_ms;
        let stabilized = self
            .recommendations
            .iter()
            .filter(|(t, _)| *t > cutoff)
            .map(|(_, r)| *r)
            .fold(desired, i32::max);
        self.remember(now, desired, down_window_ms);
        let up_limit = (i64::from(current) * 2).max(4).min(i64::from(i32::MAX)) as i32;
        let (max_allowed, over) = if bounds.max > up_limit {
            (up_limit, Limit::ScaleUpRate)
        } else {
            (bounds.max, Limit::TooMany)
        };
        let (replicas, limit) = if stabilized < bounds.min {
            (bounds.min, Limit::TooFew)
        } else if stabilized > max_allowed {
            (max_allowed, over)
        } else {
            (stabilized, Limit::WithinRange)
        };
        Normalized {
            replicas,
            stabilized: if stabilized != desired {
                Stabilized::Down
            } else {
                Stabilized::No
            },
            limit,
        }
    }

    /// With `behavior`: each direction's window, then its policies, then the bounds.
    pub fn normalize_with(
        &mut self,
        now: i64,
        current: i32,
        desired: i32,
        bounds: Bounds,
        up: &Rules,
        down: &Rules,
    ) -> Normalized {
        let (mut up_rec, mut down_rec) = (desired, desired);
        for (t, r) in &self.recommendations {
            if *t > now - up.window_ms {
                up_rec = up_rec.min(*r);
            }
            if *t > now - down.window_ms {
                down_rec = down_rec.max(*r);
            }
        }
        self.remember(now, desired, up.window_ms.max(down.window_ms));
        let mut stabilized = current.max(up_rec);
        stabilized = stabilized.min(down_rec);
        let how = match stabilized.cmp(&desired) {
            std::cmp::Ordering::Equal => Stabilized::No,
            std::cmp::Ordering::Greater => Stabilized::Down,
            std::cmp::Ordering::Less => Stabilized::Up,
        };
        let (replicas, limit) = if stabilized > current {
            let rate = up_limit(current, &self.ups, up, now).max(current);
            let (allowed, why) = if bounds.max > rate {
                (rate, Limit::ScaleUpRate)
            } else {
                (bounds.max, Limit::TooMany)
            };
            if stabilized > allowed {
                (allowed, why)
            } else {
                (stabilized, Limit::WithinRange)
            }
        } else if stabilized < current {
            let rate = down_limit(current, &self.downs, down, now).min(current);
            let (allowed, why) = if bounds.min < rate {
                (rate, Limit::ScaleDownRate)
            } else {
                (bounds.min, Limit::TooFew)
            };
            if stabilized < allowed {
                (allowed, why)
            } else {
                (stabilized, Limit::WithinRange)
            }
        } else {
            (stabilized, Limit::WithinRange)
        };
        Normalized {
            replicas,
            stabilized: how,
            limit,
        }
    }

    /// Records a change of the target from `from` to `to` at `now`, forgetting changes older
    /// than the longest policy period of `up` and `down`.
    pub fn record_scale(&mut self, now: i64, from: i32, to: i32, up: &Rules, down: &Rules) {
        let longest = |r: &Rules| r.policies.iter().map(|p| p.period_ms).max().unwrap_or(0);
        self.ups.retain(|(t, _)| *t > now - longest(up));
        self.downs.retain(|(t, _)| *t > now - longest(down));
        if to > from {
            self.ups.push((now, to - from));
        } else if to < from {
            self.downs.push((now, from - to));
        }
    }

    fn remember(&mut self, now: i64, desired: i32, window_ms: i64) {
        // Recommendations older than every window are of no more use; keep the list short.
        self.recommendations.retain(|(t, _)| *t > now - window_ms);
        self.recommendations.push((now, desired));
    }
}

fn changed_within(events: &[(i64, i32)], period_ms: i64, now: i64) -> i64 {
    events
        .iter()
        .filter(|(t, _)| *t > now - period_ms)
        .map(|(_, n)| i64::from(*n))
        .sum()
}

fn clamp_i32(v: i64) -> i32 {
    v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

/// The most replicas the scale-up policies allow now.
fn up_limit(current: i32, ups: &[(i64, i32)], rules: &Rules, now: i64) -> i32 {
    let pick: fn(i64, i64) -> i64 = match rules.select {
        Select::Disabled => return current,
        Select::Min => i64::min,
        Select::Max => i64::max,
    };
    let mut result: Option<i64> = None;
    for p in &rules.policies {
        let start = i64::from(current) - changed_within(ups, p.period_ms, now);
        let proposed = if p.pods {
            start + p.value
        } else {
            ((start as f64) * (1.0 + p.value as f64 / 100.0)).ceil() as i64
        };
        result = Some(result.map_or(proposed, |r| pick(r, proposed)));
    }
    clamp_i32(result.unwrap_or(i64::from(current)))
}

/// The fewest replicas the scale-down policies allow now.
fn down_limit(current: i32, downs: &[(i64, i32)], rules: &Rules, now: i64) -> i32 {
    // Allowing the most change is the lowest floor.
    let pick: fn(i64, i64) -> i64 = match rules.select {
        Select::Disabled => return current,
        Select::Min => i64::max,
        Select::Max => i64::min,
    };
    let mut result: Option<i64> = None;
    for p in &rules.policies {
        let start = i64::from(current) + changed_within(downs, p.period_ms, now);
        let proposed = if p.pods {
            start - p.value
        } else {
            ((start as f64) * (1.0 - p.value as f64 / 100.0)) as i64
        };
        result = Some(result.map_or(proposed, |r| pick(r, proposed)));
    }
    clamp_i32(result.unwrap_or(i64::from(current)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000;

    fn bounds(min: i32, max: i32) -> Bounds {
        Bounds { min, max }
    }

    /// Kubernetes' defaults: up by max(4 pods, 100%) per 15 s, down by 100% per 15 s.
    fn default_up() -> Rules {
        Rules {
            window_ms: 0,
            select: Select::Max,
            policies: vec![
                Policy {
                    pods: true,
                    value: 4,
                    period_ms: 15 * S,
                },
                Policy {
                    pods: false,
                    value: 100,
                    period_ms: 15 * S,
                },
            ],
        }
    }

    fn default_down(window_s: i64) -> Rules {
        Rules {
            window_ms: window_s * S,
            select: Select::Max,
            policies: vec![Policy {
                pods: false,
                value: 100,
                period_ms: 15 * S,
            }],
        }
    }

    #[test]
    fn without_behavior_a_scale_down_waits_for_the_window() {
        let mut h = History::default();
        let n = h.normalize(0, 5, 5, bounds(1, 10), 300 * S);
        assert_eq!(n.replicas, 5);
        // Load drops: the recommendation of 5 is still in the window.
        let n = h.normalize(60 * S, 5, 1, bounds(1, 10), 300 * S);
        assert_eq!((n.replicas, n.stabilized), (5, Stabilized::Down));
        // Five minutes after the last recommendation of 5, it is out.
        let n = h.normalize(301 * S, 5, 1, bounds(1, 10), 300 * S);
        assert_eq!((n.replicas, n.stabilized), (1, Stabilized::No));
    }

    #[test]
    fn without_behavior_a_scale_up_is_at_most_double_or_four_and_bounded() {
        let mut h = History::default();
        let n = h.normalize(0, 1, 50, bounds(1, 100), 0);
        assert_eq!((n.replicas, n.limit), (4, Limit::ScaleUpRate));
        let n = h.normalize(S, 10, 50, bounds(1, 100), 0);
        assert_eq!((n.replicas, n.limit), (20, Limit::ScaleUpRate));
        let n = h.normalize(2 * S, 10, 50, bounds(1, 12), 0);
        assert_eq!((n.replicas, n.limit), (12, Limit::TooMany));
        let n = h.normalize(3 * S, 3, 1, bounds(2, 12), 0);
        assert_eq!((n.replicas, n.limit), (2, Limit::TooFew));
    }

    #[test]
    fn scale_up_policies_count_what_was_added_in_their_period() {
        let mut h = History::default();
        let (up, down) = (default_up(), default_down(300));
        // From 2: max(2 + 4, 2 × 2) = 6.
        let n = h.normalize_with(0, 2, 20, bounds(1, 50), &up, &down);
        assert_eq!((n.replicas, n.limit), (6, Limit::ScaleUpRate));
        h.record_scale(0, 2, 6, &up, &down);
        // 5 s later the period still holds the 4 added: from a start of 2 again, 6.
        let n = h.normalize_with(5 * S, 6, 20, bounds(1, 50), &up, &down);
        assert_eq!(n.replicas, 6);
        // After the period, from 6: max(10, 12) = 12.
        let n = h.normalize_with(16 * S, 6, 20, bounds(1, 50), &up, &down);
        assert_eq!(n.replicas, 12);
    }

    #[test]
    fn scale_down_is_held_by_the_window_then_limited_by_policy() {
        let mut h = History::default();
        let up = default_up();
        let down = Rules {
            window_ms: 60 * S,
            select: Select::Max,
            policies: vec![Policy {
                pods: true,
                value: 2,
                period_ms: 30 * S,
            }],
        };
        h.normalize_with(0, 8, 8, bounds(1, 10), &up, &down);
        let n = h.normalize_with(30 * S, 8, 1, bounds(1, 10), &up, &down);
        assert_eq!((n.replicas, n.stabilized), (8, Stabilized::Down));
        // The 8 left the window; the policy allows 2 pods per 30 s.
        let n = h.normalize_with(61 * S, 8, 1, bounds(1, 10), &up, &down);
        assert_eq!((n.replicas, n.limit), (6, Limit::ScaleDownRate));
        h.record_scale(61 * S, 8, 6, &up, &down);
        let n = h.normalize_with(70 * S, 6, 1, bounds(1, 10), &up, &down);
        assert_eq!(n.replicas, 6, "2 already removed within 30 s");
        let n = h.normalize_with(92 * S, 6, 1, bounds(1, 10), &up, &down);
        assert_eq!(n.replicas, 4);
    }

    #[test]
    fn a_disabled_direction_never_moves_and_min_picks_the_smaller_change() {
        let mut h = History::default();
        let disabled = Rules {
            select: Select::Disabled,
            ..default_up()
        };
        let n = h.normalize_with(0, 3, 9, bounds(1, 10), &disabled, &default_down(0));
        assert_eq!(n.replicas, 3);
        let min_up = Rules {
            select: Select::Min,
            ..default_up()
        };
        // From 10: min(10 + 4, 20) = 14.
        let n = h.normalize_with(S, 10, 40, bounds(1, 50), &min_up, &default_down(0));
        assert_eq!(n.replicas, 14);
    }

    #[test]
    fn a_scale_up_window_takes_the_lowest_recent_recommendation() {
        let mut h = History::default();
        let up = Rules {
            window_ms: 60 * S,
            ..default_up()
        };
        let down = default_down(0);
        h.normalize_with(0, 2, 2, bounds(1, 10), &up, &down);
        let n = h.normalize_with(10 * S, 2, 6, bounds(1, 10), &up, &down);
        assert_eq!((n.replicas, n.stabilized), (2, Stabilized::Up));
        let n = h.normalize_with(61 * S, 2, 6, bounds(1, 10), &up, &down);
        assert_eq!(n.replicas, 6);
    }
}
