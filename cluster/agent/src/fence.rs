//! The node's own federation fence, for process nodes: what stops a node's `AtMostOnce` pods
//! when its shard has lost the federation and the shard's control plane cannot say so — it is
//! frozen (SIGSTOP), hung or unreachable from the node, while the node's containers, real
//! processes, run on. Without it a frozen control plane would leave its Job's pod running
//! here while the federation, past the shard's lease, starts the Job on another shard.
//!
//! The shard's federation agent renews the Lease `kube-system/tessera-federation` with the
//! time its own lease with the federation ends (never later than the federation's). The node
//! reads it every second while its API answers and remembers that end, by its own monotonic
//! clock. When the end passes without a newer one read, the node stops every pod of a
//! federated `AtMostOnce` workload it runs (SIGTERM, then SIGKILL after the pod's grace
//! period) — by the lease's end plus the grace period, before the federation may start the
//! work elsewhere (lease + grace + margin). A shard that never joined a federation has no such
//! Lease and the node fences nothing. Pods of `Fast` workloads run on, as they would
//! anywhere: the federation starts copies of those at once and never waits for them.
//!
//! The fence decides from what it knew last; what it acts on (stopping processes) needs no
//! API, which is the point.

use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use tessera_client::types::{FAILOVER_ANNOTATION, federation_lease_end};

/// How often the Lease is read.
pub const PERIOD: Duration = Duration::from_secs(1);

/// What the node knows of its shard's federation lease.
#[derive(Debug, Default)]
pub struct NodeFence {
    /// When the lease ends by this node's clock (`None`: no federation, or none seen yet).
    until: Option<Instant>,
    /// The lease ended and the node's `AtMostOnce` pods were stopped.
    fenced: bool,
}

impl NodeFence {
    /// A read of the Lease: `Some(lease)` as read, `None` if the shard has none (404).
    /// `now_wall` and `now` are the same instant on both clocks.
    pub fn observe(&mut self, lease: Option<&Value>, now_wall: SystemTime, now: Instant) {
        let Some(lease) = lease else {
            self.until = None;
            self.fenced = false;
            return;
        };
        let Some(end) = federation_lease_end(lease) else {
            return;
        };
        let wall = now_wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let left = end - wall;
        let until = if left >= 0.0 {
            now + Duration::from_secs_f64(left)
        } else {
            now.checked_sub(Duration::from_secs_f64(-left))
                .unwrap_or(now)
        };
        if until > now {
            // Renewed: the federation has the shard again.
            self.fenced = false;
        }
        self.until = Some(until);
    }

    /// True once, at the first look after the lease ended: the node's `AtMostOnce` pods are
    /// to be stopped now.
    pub fn lapsed(&mut self, now: Instant) -> bool {
        if self.fenced || self.until.is_none_or(|u| now < u) {
            return false;
        }
        self.fenced = true;
        true
    }

    /// Whether the lease has ended and not been renewed since.
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// Whether the shard is in a federation (a lease was read).
    pub fn knows_federation(&self) -> bool {
        self.until.is_some()
    }
}

/// How a federated workload fails over, from its object's annotations: `Some(true)` for
/// `AtMostOnce`, `Some(false)` for `Fast`, `None` if it says nothing (not federated, or a
/// Job a CronJob made: its CronJob says).
pub fn at_most_once(obj: &Value) -> Option<bool> {
    match obj["metadata"]["annotations"][FAILOVER_ANNOTATION].as_str()? {
        "AtMostOnce" => Some(true),
        _ => Some(false),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn lease(renewed: SystemTime, secs: i64) -> Value {
        json!({"spec": {"holderIdentity": "shard-a",
            "renewTime": tessera_core::time::rfc3339_micro(renewed),
            "leaseDurationSeconds": secs}})
    }

    #[test]
    fn the_fence_closes_once_when_the_lease_it_last_read_ends() {
        let (wall, t0) = (SystemTime::now(), Instant::now());
        let s = Duration::from_secs;
        let mut f = NodeFence::default();
        assert!(
            !f.lapsed(t0 + s(3600)),
            "no federation seen: nothing to fence"
        );
        // Renewed 2 s ago for 5 s: it ends 3 s from now, whatever the API does meanwhile.
        f.observe(Some(&lease(wall - s(2), 5)), wall, t0);
        assert!(!f.lapsed(t0 + Duration::from_millis(2_900)));
        assert!(f.lapsed(t0 + s(3)), "ended");
        assert!(f.is_fenced());
        assert!(!f.lapsed(t0 + s(4)), "stopped once");
        // The shard is back: a renewal read ends the fence.
        f.observe(Some(&lease(wall + s(10), 5)), wall + s(10), t0 + s(10));
        assert!(!f.is_fenced());
        assert!(!f.lapsed(t0 + s(14)));
        assert!(f.lapsed(t0 + s(15)));
        // A Lease nobody holds says nothing; the last end stands.
        let mut g = NodeFence::default();
        g.observe(Some(&lease(wall, 5)), wall, t0);
        g.observe(Some(&json!({"spec": {}})), wall + s(1), t0 + s(1));
        assert!(g.lapsed(t0 + s(5)));
        // The shard left its federation (the Lease is gone): nothing more is fenced.
        g.observe(None, wall + s(6), t0 + s(6));
        assert!(!g.is_fenced());
        assert!(!g.lapsed(t0 + s(3600)));
    }

    #[test]
    fn the_failover_mode_is_read_from_the_annotation() {
        let with = |v: &str| json!({"metadata": {"annotations": {FAILOVER_ANNOTATION: v}}});
        assert_eq!(at_most_once(&with("AtMostOnce")), Some(true));
        assert_eq!(at_most_once(&with("Fast")), Some(false));
        assert_eq!(at_most_once(&json!({"metadata": {}})), None);
    }
}
