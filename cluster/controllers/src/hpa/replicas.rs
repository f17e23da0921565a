//! How many replicas one metric asks for, as Kubernetes' replica calculator computes it: the
//! ratio of the pods' average to the target, applied to the ready pods — within a tolerance
//! nothing changes; pods without a sample count as using all of their request (or the
//! target) when scaling down and nothing when scaling up; pods not ready yet count as
//! using nothing when scaling up and are left out otherwise; and a correction that would
//! flip the direction of the change keeps the current count.

/// What a pod counts as, from its phase, readiness and sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    /// Ready, with a sample.
    Ready,
    /// Starting (pending, or not ready within its initialization period).
    Unready,
    /// Running but without a sample.
    Missing,
}

/// One pod: its state, usage (milli-units, for [`PodState::Ready`]) and request (milli-units;
/// for utilization targets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// What the pod counts as.
    pub state: PodState,
    /// Its usage.
    pub usage: i64,
    /// Its request of the resource.
    pub request: i64,
}

/// What the metric is held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A percentage of the pods' requests.
    Utilization(i64),
    /// An average per pod (milli-units).
    AverageValue(i64),
}

/// One metric's proposal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proposal {
    /// Replicas.
    pub replicas: i32,
    /// The pods' utilization (percent of requests), for utilization targets.
    pub utilization: Option<i64>,
    /// The pods' average usage (milli-units).
    pub average: i64,
}

/// Why no proposal could be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoProposal {
    /// The selector selects no pod.
    #[error("no pods returned by selector while calculating replica count")]
    NoPods,
    /// No pod had a sample that counts.
    #[error("did not receive metrics for targeted pods (pods might be unready)")]
    NoMetrics,
    /// The pods with samples request none of the resource.
    #[error("the targeted pods request none of the resource, so their utilization is undefined")]
    NoRequests,
}

/// (ratio to target, utilization, average) of `samples`.
fn ratio<'a>(samples: impl Iterator<Item = &'a Sample>, target: Target) -> Option<(f64, i64, i64)> {
    let (mut usage, mut requests, mut n) = (0i128, 0i128, 0i128);
    for s in samples {
        usage += i128::from(s.usage);
        requests += i128::from(s.request);
        n += 1;
    }
    if n == 0 {
        return None;
    }
    let average = (usage / n) as i64;
    match target {
        Target::Utilization(t) => {
            if requests == 0 {
                return None;
            }
            let utilization = (usage * 100 / requests) as i64;
            Some((utilization as f64 / t as f64, utilization, average))
        }
        Target::AverageValue(t) => Some((average as f64 / t as f64, 0, average)),
    }
}

/// The replicas `samples` ask for at `current` replicas, within `tolerance` (0.1: ±10%).
pub fn propose(
    current: i32,
    samples: &[Sample],
    target: Target,
    tolerance: f64,
) -> Result<Proposal, NoProposal> {
    if samples.is_empty() {
        return Err(NoProposal::NoPods);
    }
    let ready = || samples.iter().filter(|s| s.state == PodState::Ready);
    let ready_count = ready().count();
    if ready_count == 0 {
        return Err(NoProposal::NoMetrics);
    }
    let Some((usage_ratio, utilization, average)) = ratio(ready(), target) else {
        return Err(NoProposal::NoRequests);
    };
    let proposal = |replicas: i32| Proposal {
        replicas,
        utilization: matches!(target, Target::Utilization(_)).then_some(utilization),
        average,
    };
    let unready = samples
        .iter()
        .filter(|s| s.state == PodState::Unready)
        .count();
    let missing = samples
        .iter()
        .filter(|s| s.state == PodState::Missing)
        .count();
    let up_with_unready = unready > 0 && usage_ratio > 1.0;
    if !up_with_unready && missing == 0 {
        if (1.0 - usage_ratio).abs() <= tolerance {
            return Ok(proposal(current));
        }
        return Ok(proposal(ceil(usage_ratio * ready_count as f64)));
    }
    // Fill in the pods without a usable sample, against the direction of the change.
    let filled: Vec<Sample> = samples
        .iter()
        .filter_map(|s| match s.state {
            PodState::Ready => Some(*s),
            PodState::Missing if usage_ratio < 1.0 => Some(Sample {
                usage: match target {
                    Target::Utilization(t) => s.request * t.max(100) / 100,
                    Target::AverageValue(t) => t,
                },
                ..*s
            }),
            PodState::Missing => Some(Sample { usage: 0, ..*s }),
            PodState::Unready if up_with_unready => Some(Sample { usage: 0, ..*s }),
            PodState::Unready => None,
        })
        .collect();
    let Some((new_ratio, _, _)) = ratio(filled.iter(), target) else {
        return Ok(proposal(current));
    };
    let flipped = (usage_ratio < 1.0 && new_ratio > 1.0) || (usage_ratio > 1.0 && new_ratio < 1.0);
    if (1.0 - new_ratio).abs() <= tolerance || flipped {
        return Ok(proposal(current));
    }
    let replicas = ceil(new_ratio * filled.len() as f64);
    if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
        return Ok(proposal(current));
    }
    Ok(proposal(replicas))
}

fn ceil(x: f64) -> i32 {
    x.ceil().clamp(0.0, f64::from(i32::MAX)) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(usage: i64, request: i64) -> Sample {
        Sample {
            state: PodState::Ready,
            usage,
            request,
        }
    }

    fn with(state: PodState, request: i64) -> Sample {
        Sample {
            state,
            usage: 0,
            request,
        }
    }

    #[test]
    fn utilization_above_target_scales_by_the_ratio() {
        // 3 pods at 90% of 100m against 50%: ratio 1.8, ceil(1.8 * 3) = 6.
        let s = [ready(90, 100), ready(90, 100), ready(90, 100)];
        let p = propose(3, &s, Target::Utilization(50), 0.1).expect("proposal");
        assert_eq!(p.replicas, 6);
        assert_eq!(p.utilization, Some(90));
        assert_eq!(p.average, 90);
    }

    #[test]
    fn within_the_tolerance_nothing_changes() {
        let s = [ready(54, 100), ready(54, 100)];
        assert_eq!(
            propose(2, &s, Target::Utilization(50), 0.1)
                .expect("p")
                .replicas,
            2
        );
        // Just outside it: 56% / 50% = 1.12.
        let s = [ready(56, 100), ready(56, 100)];
        assert_eq!(
            propose(2, &s, Target::Utilization(50), 0.1)
                .expect("p")
                .replicas,
            3
        );
    }

    #[test]
    fn low_usage_scales_down() {
        let s = [
            ready(10, 100),
            ready(10, 100),
            ready(10, 100),
            ready(10, 100),
        ];
        assert_eq!(
            propose(4, &s, Target::Utilization(50), 0.1)
                .expect("p")
                .replicas,
            1
        );
    }

    #[test]
    fn missing_samples_damp_a_scale_down() {
        // Two pods idle, two without samples: those count as using their whole request,
        // so the average is 50% — at target: no change instead of going to 1.
        let s = [
            ready(0, 100),
            ready(0, 100),
            with(PodState::Missing, 100),
            with(PodState::Missing, 100),
        ];
        assert_eq!(
            propose(4, &s, Target::Utilization(50), 0.1)
                .expect("p")
                .replicas,
            4
        );
    }

    #[test]
    fn unready_pods_count_as_idle_when_scaling_up() {
        // One pod at 200% of request, three starting: (200 + 0 + 0 + 0) / 4 = 50% of
        // request, against 50%: the new pods are expected to take the load.
        let s = [
            ready(200, 100),
            with(PodState::Unready, 100),
            with(PodState::Unready, 100),
            with(PodState::Unready, 100),
        ];
        assert_eq!(
            propose(4, &s, Target::Utilization(50), 0.1)
                .expect("p")
                .replicas,
            4
        );
        // Without them, one pod at 200% against 50% would ask for 4 on its own.
        assert_eq!(
            propose(1, &s[..1], Target::Utilization(50), 0.1)
                .expect("p")
                .replicas,
            4
        );
    }

    #[test]
    fn average_values_scale_against_their_target() {
        let s = [ready(300, 0), ready(300, 0)];
        let p = propose(2, &s, Target::AverageValue(100), 0.1).expect("p");
        assert_eq!(p.replicas, 6);
        assert_eq!(p.utilization, None);
        assert_eq!(p.average, 300);
    }

    #[test]
    fn no_pods_or_no_samples_give_no_proposal() {
        assert_eq!(
            propose(1, &[], Target::Utilization(50), 0.1),
            Err(NoProposal::NoPods)
        );
        assert_eq!(
            propose(
                1,
                &[with(PodState::Unready, 100)],
                Target::Utilization(50),
                0.1
            ),
            Err(NoProposal::NoMetrics)
        );
        assert_eq!(
            propose(1, &[ready(10, 0)], Target::Utilization(50), 0.1),
            Err(NoProposal::NoRequests)
        );
    }
}
