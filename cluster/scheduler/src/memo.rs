//! Filter results shared by pods that are alike — the replicas of one ReplicaSet or Job,
//! created from one template — so that the second replica does not run every Filter again
//! on a node the first one already judged and that has not changed since.
//!
//! Only *local* filters are remembered: those whose answer for a node depends on the pod
//! and that node alone (its object, its pods, the pods nominated to it). Their answer for
//! a node is a function of the pod's class and the node's
//! [`generation`](crate::resources::NodeInfo::generation), and every change to a node gives
//! it a generation no other node entry ever had, so an entry `(index, generation)` can
//! only ever describe one node in one state (even after entries moved in the node vector).
//! Filters that read other nodes (spreading, pod affinity) run every time.
//!
//! The memo lives in the [`Cache`](crate::cache::Cache) it describes and goes with it. Each
//! class is a flat vector of one atomic word per node, so that the workers deciding one
//! round at once (all reading the same snapshot) fill and read it without a lock: whatever
//! a worker stores is true of that node at that generation, whoever reads it.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::resources::PodInfo;

/// Classes remembered at once; the least recently used goes first. Each costs 8 bytes per
/// node (40 KB at 5,000 nodes).
pub const MAX_CLASSES: usize = 32;

/// Generations at or above this are not remembered (the word keeps 8 bits for the
/// outcome); 2^56 changes is more than a cache ever sees.
const MAX_GENERATION: u64 = 1 << 56;

/// What a node's local filters said of a class's pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    /// Every local filter passed.
    Pass,
    /// The filter at this index of the profile's Filter plugins rejected the pod (the first
    /// local one to do so).
    Fail(usize),
}

/// The local filters' outcomes of one class, one word per node index: `generation << 8 |
/// tag`, tag 1 for [`Local::Pass`] and `2 + j` for [`Local::Fail`]`(j)`; 0 is nothing known.
pub struct NodeMemo {
    words: Vec<AtomicU64>,
}

impl NodeMemo {
    fn new(nodes: usize) -> Self {
        NodeMemo {
            words: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// What is known of node `index` at `generation`.
    pub fn get(&self, index: usize, generation: u64) -> Option<Local> {
        let w = self.words.get(index)?.load(Ordering::Relaxed);
        if w == 0 || w >> 8 != generation {
            return None;
        }
        match w & 0xff {
            1 => Some(Local::Pass),
            t => Some(Local::Fail(t as usize - 2)),
        }
    }

    /// Remembers what node `index` at `generation` said.
    pub fn put(&self, index: usize, generation: u64, outcome: Local) {
        let tag = match outcome {
            Local::Pass => 1,
            Local::Fail(j) if j < 254 => j as u64 + 2,
            Local::Fail(_) => return,
        };
        if generation >= MAX_GENERATION {
            return;
        }
        if let Some(w) = self.words.get(index) {
            w.store(generation << 8 | tag, Ordering::Relaxed);
        }
    }
}

struct Class {
    profile: usize,
    fingerprint: u64,
    /// The pod the class was made for: another pod joins only if it is alike in full (a
    /// fingerprint may collide).
    like: Arc<PodInfo>,
    last_used: u64,
    memo: NodeMemo,
}

/// Filter results by class of alike pods (see the module's documentation).
#[derive(Default)]
pub struct FilterMemo {
    classes: Vec<Class>,
    /// Counts rounds: a class prepared in the current round is not evicted in it.
    round: u64,
}

/// A class's place in a [`FilterMemo`], valid until the next [`FilterMemo::next_round`].
#[derive(Clone, Copy, Debug)]
pub struct Slot(usize);

impl FilterMemo {
    /// Starts a round of decisions: slots handed out before are no longer held.
    pub fn next_round(&mut self) {
        self.round += 1;
    }

    /// The class of `pod` under profile `profile`, made if new, sized for `nodes` node
    /// entries. None if every class is in use this round.
    pub fn prepare(&mut self, profile: usize, pod: &Arc<PodInfo>, nodes: usize) -> Option<Slot> {
        let fingerprint = fingerprint(pod);
        let round = self.round;
        if let Some(i) = self
            .classes
            .iter()
            .position(|c| c.profile == profile && c.fingerprint == fingerprint)
        {
            let c = &mut self.classes[i];
            if !alike(&c.like, pod) {
                return None;
            }
            c.last_used = round;
            if c.memo.words.len() < nodes {
                c.memo
                    .words
                    .extend((c.memo.words.len()..nodes).map(|_| AtomicU64::new(0)));
            }
            return Some(Slot(i));
        }
        let class = Class {
            profile,
            fingerprint,
            like: pod.clone(),
            last_used: round,
            memo: NodeMemo::new(nodes),
        };
        if self.classes.len() < MAX_CLASSES {
            self.classes.push(class);
            return Some(Slot(self.classes.len() - 1));
        }
        let (i, _) = self
            .classes
            .iter()
            .enumerate()
            .filter(|(_, c)| c.last_used < round)
            .min_by_key(|(_, c)| c.last_used)?;
        self.classes[i] = class;
        Some(Slot(i))
    }

    /// The memo of a prepared class.
    pub fn at(&self, slot: Slot) -> &NodeMemo {
        &self.classes[slot.0].memo
    }

    /// Classes remembered.
    pub fn len(&self) -> usize {
        self.classes.len()
    }

    /// True if no class is remembered.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }
}

/// True if two pods are alike for every filter: same namespace, labels and spec.
fn alike(a: &PodInfo, b: &PodInfo) -> bool {
    let (a, b) = (&a.pod, &b.pod);
    a.metadata.namespace == b.metadata.namespace
        && a.metadata.labels == b.metadata.labels
        && a.spec == b.spec
}

/// A hash of what [`alike`] compares, streamed from the pod's JSON form (no allocation).
fn fingerprint(pod: &PodInfo) -> u64 {
    struct HashWriter<'a>(&'a mut std::hash::DefaultHasher);
    impl std::io::Write for HashWriter<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.write(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut h = std::hash::DefaultHasher::new();
    let p = &pod.pod;
    p.metadata.namespace.hash(&mut h);
    // Writing to a hasher cannot fail; a value that would not serialize only weakens the
    // fingerprint, and `alike` still decides.
    let _ = serde_json::to_writer(HashWriter(&mut h), &p.metadata.labels);
    let _ = serde_json::to_writer(HashWriter(&mut h), &p.spec);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, cpu: &str, labels: serde_json::Value) -> Arc<PodInfo> {
        Arc::new(PodInfo::new(Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "labels": labels},
                "spec": {"containers": [{"name": "c", "image": "i",
                    "resources": {"requests": {"cpu": cpu}}}]}
            }))
            .expect("test value"),
        )))
    }

    #[test]
    fn a_word_holds_an_outcome_for_one_generation_only() {
        let m = NodeMemo::new(3);
        assert_eq!(m.get(1, 7), None);
        m.put(1, 7, Local::Pass);
        assert_eq!(m.get(1, 7), Some(Local::Pass));
        assert_eq!(m.get(1, 8), None, "a node that changed is judged again");
        assert_eq!(m.get(0, 7), None);
        m.put(1, 9, Local::Fail(3));
        assert_eq!(m.get(1, 9), Some(Local::Fail(3)));
        assert_eq!(m.get(1, 7), None);
        m.put(1, MAX_GENERATION, Local::Pass);
        assert_eq!(
            m.get(1, 9),
            Some(Local::Fail(3)),
            "too high a generation is not kept"
        );
        assert_eq!(m.get(5, 9), None, "beyond the vector: nothing known");
    }

    #[test]
    fn replicas_share_a_class_and_different_pods_do_not() {
        let mut memo = FilterMemo::default();
        memo.next_round();
        let a = memo.prepare(0, &pod("web-1", "100m", json!({"app": "web"})), 4);
        let b = memo.prepare(0, &pod("web-2", "100m", json!({"app": "web"})), 4);
        assert_eq!(a.map(|s| s.0), b.map(|s| s.0), "names differ, nothing else");
        let c = memo.prepare(0, &pod("web-3", "200m", json!({"app": "web"})), 4);
        let d = memo.prepare(0, &pod("web-4", "100m", json!({"app": "api"})), 4);
        let e = memo.prepare(1, &pod("web-5", "100m", json!({"app": "web"})), 4);
        let slots: Vec<usize> = [a, c, d, e]
            .iter()
            .map(|s| s.expect("test value").0)
            .collect();
        assert_eq!(
            slots,
            vec![0, 1, 2, 3],
            "requests, labels and profile each split"
        );
        assert_eq!(memo.len(), 4);
    }

    #[test]
    fn a_class_grows_with_the_nodes_and_the_oldest_unused_is_evicted() {
        let mut memo = FilterMemo::default();
        memo.next_round();
        let s = memo
            .prepare(0, &pod("a", "1m", json!({})), 2)
            .expect("test value");
        memo.at(s).put(1, 5, Local::Pass);
        let s = memo
            .prepare(0, &pod("a2", "1m", json!({})), 10)
            .expect("test value");
        assert_eq!(memo.at(s).words.len(), 10);
        assert_eq!(
            memo.at(s).get(1, 5),
            Some(Local::Pass),
            "kept across a resize"
        );
        for i in 2..=MAX_CLASSES {
            memo.prepare(0, &pod("b", &format!("{i}m"), json!({})), 2)
                .expect("test value");
        }
        assert_eq!(memo.len(), MAX_CLASSES);
        assert!(
            memo.prepare(0, &pod("full", "999m", json!({})), 2)
                .is_none(),
            "every class is held by this round"
        );
        memo.next_round();
        memo.prepare(0, &pod("b", "5m", json!({})), 2)
            .expect("test value");
        let fresh = memo
            .prepare(0, &pod("new", "999m", json!({})), 2)
            .expect("test value");
        assert_eq!(
            fresh.0, 0,
            "the least recently used class (the first) makes room"
        );
        assert_eq!(memo.len(), MAX_CLASSES);
    }
}
