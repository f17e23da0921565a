//! The shard's safety invariants, checked at every revision of a whole run from a watch of
//! every pod — not only at the end, when a violation may already have healed:
//!
//! - no node ever holds more cpu, memory or pods (requests of its bound, unfinished pods)
//!   than its allocatable;
//! - a pod's `spec.nodeName`, once set, never changes (no pod bound twice);
//! - no acknowledged write is lost: after the server restarts, its revision is not behind the
//!   last one the watch saw, and the watch resumes from there without a gap;
//! - no gang is ever partly bound: at the end of every revision, each PodGroup the test
//!   declared has no member bound or at least its minMember.
//!
//! The watch follows the server across restarts (re-reading the kubeconfig it rewrites).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use parking_lot::Mutex;
use serde_json::Value;
use tessera_apiserver::catalog::{RESOURCES, Resource};
use tessera_apiserver::client::{Client, HttpClient};
use tessera_apiserver::request::{ApiRequest, Verb};
use tessera_core::Quantity;

/// What a pod or a node counts: cpu in millicores, memory in bytes, pods.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Amounts {
    pub cpu: i64,
    pub memory: i64,
    pub pods: i64,
}

fn quantity(v: &Value) -> Option<Quantity> {
    v.as_str()?.parse().ok()
}

/// A node's allocatable.
pub fn allocatable(node: &Value) -> Amounts {
    let a = &node["status"]["allocatable"];
    Amounts {
        cpu: quantity(&a["cpu"]).map_or(0, |q| q.milli_ceil()),
        memory: quantity(&a["memory"]).map_or(0, |q| q.units_ceil()),
        pods: quantity(&a["pods"]).map_or(0, |q| q.units_ceil()),
    }
}

/// A pod's requests as the scheduler counts them: its containers' sum, or the largest init
/// container's when that is more.
pub fn requests(pod: &Value) -> Amounts {
    let each = |list: &Value, key: &str, f: fn(Quantity) -> i64| -> Vec<i64> {
        list.as_array()
            .into_iter()
            .flatten()
            .map(|c| quantity(&c["resources"]["requests"][key]).map_or(0, f))
            .collect()
    };
    let spec = &pod["spec"];
    let amount = |key: &str, f: fn(Quantity) -> i64| -> i64 {
        let containers: i64 = each(&spec["containers"], key, f).iter().sum();
        let init = each(&spec["initContainers"], key, f).into_iter().max();
        containers.max(init.unwrap_or(0))
    };
    Amounts {
        cpu: amount("cpu", |q| q.milli_ceil()),
        memory: amount("memory", |q| q.units_ceil()),
        pods: 1,
    }
}

#[derive(Debug)]
struct PodUse {
    name: String,
    node: String,
    uses: Amounts,
}

/// The invariants' state, fed one watch event at a time (pure: unit-tested with made-up
/// events).
#[derive(Debug, Default)]
pub struct Checker {
    nodes: HashMap<String, Amounts>,
    /// Bound, unfinished pods by uid.
    pods: HashMap<String, PodUse>,
    /// Every binding ever seen, by uid: a pod's node may never change.
    bound: HashMap<String, String>,
    /// The newest revision seen.
    pub revision: i64,
    /// Events seen.
    pub events: usize,
    /// Pods seen bound.
    pub bindings: usize,
    /// Times the watch followed the server to a new connection (a restart) and resumed.
    pub resumes: usize,
    /// What went wrong, each once.
    pub violations: Vec<String>,
    /// The PodGroups declared (`namespace/name` → minMember) and their members seen bound.
    gangs: HashMap<String, usize>,
    gang_bound: HashMap<String, usize>,
}

impl Checker {
    /// Learns a node's allocatable.
    pub fn node(&mut self, node: &Value) {
        if let Some(name) = node["metadata"]["name"].as_str() {
            self.nodes.insert(name.to_owned(), allocatable(node));
        }
    }

    /// Whether the checker knows `node`.
    pub fn knows(&self, node: &str) -> bool {
        self.nodes.contains_key(node)
    }

    /// Declares the PodGroup `key` (`namespace/name`) of `min_member`: from now on its
    /// members bound are counted, and checked at the end of every revision.
    pub fn gang(&mut self, key: &str, min_member: usize) {
        self.gangs.insert(key.to_owned(), min_member);
    }

    /// Gangs with some but fewer than minMember members bound (the state at the end of a
    /// revision: members bound in one transaction arrive as events of one revision).
    pub fn check_gangs(&mut self) {
        for (g, min) in &self.gangs {
            let n = self.gang_bound.get(g).copied().unwrap_or(0);
            if n > 0 && n < *min {
                let v = format!(
                    "gang {g} partly bound at revision {}: {n} of minMember {min}",
                    self.revision
                );
                if !self.violations.contains(&v) {
                    self.violations.push(v);
                }
            }
        }
    }

    /// Gangs whose members were seen bound: (gang, members bound).
    pub fn gangs_bound(&self) -> Vec<(String, usize)> {
        self.gang_bound
            .iter()
            .map(|(g, n)| (g.clone(), *n))
            .collect()
    }

    /// Applies one pod event (`ADDED`, `MODIFIED`, `DELETED`) and checks the node it touches.
    pub fn pod(&mut self, ty: &str, pod: &Value) {
        self.events += 1;
        let meta = &pod["metadata"];
        let (Some(uid), Some(name)) = (meta["uid"].as_str(), meta["name"].as_str()) else {
            return;
        };
        if let Some(rv) = meta["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse::<i64>().ok())
        {
            if rv > self.revision && !self.gangs.is_empty() {
                // The previous revision is complete.
                self.check_gangs();
            }
            self.revision = self.revision.max(rv);
        }
        let node = pod["spec"]["nodeName"].as_str();
        match (self.bound.get(uid), node) {
            (Some(before), Some(now)) if before != now => self.violations.push(format!(
                "pod {name} ({uid}) bound to {before} and then to {now}"
            )),
            (Some(before), None) => self.violations.push(format!(
                "pod {name} ({uid}) was bound to {before} and is unbound again"
            )),
            (None, Some(now)) => {
                self.bindings += 1;
                self.bound.insert(uid.to_owned(), now.to_owned());
                if let Some(g) = meta["labels"]["scheduling.x-k8s.io/pod-group"].as_str() {
                    let key = format!("{}/{g}", meta["namespace"].as_str().unwrap_or(""));
                    if self.gangs.contains_key(&key) {
                        *self.gang_bound.entry(key).or_insert(0) += 1;
                    }
                }
            }
            _ => {}
        }
        let phase = pod["status"]["phase"].as_str().unwrap_or_default();
        let finished = phase == "Succeeded" || phase == "Failed";
        match node {
            Some(node) if ty != "DELETED" && !finished => {
                self.pods.insert(
                    uid.to_owned(),
                    PodUse {
                        name: name.to_owned(),
                        node: node.to_owned(),
                        uses: requests(pod),
                    },
                );
                self.check_node(node);
            }
            _ => {
                self.pods.remove(uid);
            }
        }
    }

    fn check_node(&mut self, node: &str) {
        let Some(alloc) = self.nodes.get(node).copied() else {
            self.violations
                .push(format!("a pod is bound to {node}, which is not a node"));
            return;
        };
        let mut used = Amounts::default();
        let mut names = Vec::new();
        for p in self.pods.values().filter(|p| p.node == node) {
            used.cpu += p.uses.cpu;
            used.memory += p.uses.memory;
            used.pods += p.uses.pods;
            names.push(p.name.as_str());
        }
        if used.cpu > alloc.cpu || used.memory > alloc.memory || used.pods > alloc.pods {
            names.sort_unstable();
            names.truncate(8);
            let v = format!(
                "node {node} over its allocatable at revision {}: uses {used:?} of {alloc:?} ({names:?})",
                self.revision
            );
            self.violations.push(v);
        }
    }
}

fn resource(plural: &str) -> &'static Resource {
    RESOURCES
        .iter()
        .find(|r| r.group.is_empty() && r.plural == plural)
        .expect("served")
}

/// A background watch that checks the invariants until [`Invariants::finish`].
pub struct Invariants {
    stop: Arc<AtomicBool>,
    checker: Arc<Mutex<Checker>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Invariants {
    /// Starts watching the cluster whose kubeconfig is at `kubeconfig`; returns once the
    /// first list is in.
    pub fn watch(kubeconfig: PathBuf) -> Invariants {
        Invariants::watch_all(vec![kubeconfig])
    }

    /// Watches several clusters as one: a node that is in more than one of them (lent by
    /// one shard to another) is checked against the pods bound to it in all of them.
    pub fn watch_all(kubeconfigs: Vec<PathBuf>) -> Invariants {
        let stop = Arc::new(AtomicBool::new(false));
        let checker = Arc::new(Mutex::new(Checker::default()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let n = kubeconfigs.len();
        let threads: Vec<_> = kubeconfigs
            .into_iter()
            .map(|kubeconfig| {
                let (stop, checker, ready_tx) = (stop.clone(), checker.clone(), ready_tx.clone());
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("runtime");
                    rt.block_on(follow(kubeconfig, stop, checker, ready_tx));
                })
            })
            .collect();
        for _ in 0..n {
            ready_rx
                .recv_timeout(Duration::from_secs(30))
                .expect("the invariant watch started");
        }
        Invariants {
            stop,
            checker,
            threads,
        }
    }

    /// Declares a PodGroup whose members must never be partly bound (see
    /// [`Checker::gang`]).
    pub fn gang(&self, key: &str, min_member: usize) {
        self.checker.lock().gang(key, min_member);
    }

    /// Gangs whose members were seen bound so far: (gang, members bound).
    pub fn gangs_bound(&self) -> Vec<(String, usize)> {
        self.checker.lock().gangs_bound()
    }

    /// Stops watching and asserts that nothing was violated; returns what was checked:
    /// (pod events, bindings, resumes).
    pub fn finish(mut self) -> (usize, usize, usize) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let mut c = self.checker.lock();
        c.check_gangs();
        assert!(
            c.violations.is_empty(),
            "{} invariant violations during the run, the first ones:\n{}",
            c.violations.len(),
            c.violations[..c.violations.len().min(10)].join("\n")
        );
        (c.events, c.bindings, c.resumes)
    }
}

impl Drop for Invariants {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

async fn list(client: &HttpClient, plural: &str) -> Option<Value> {
    client
        .list(ApiRequest::new(Verb::List, resource(plural)))
        .await
        .ok()
}

async fn learn_nodes(client: &HttpClient, checker: &Mutex<Checker>) {
    if let Some(nodes) = list(client, "nodes").await {
        let mut c = checker.lock();
        for n in nodes["items"].as_array().into_iter().flatten() {
            c.node(n);
        }
    }
}

async fn follow(
    kubeconfig: PathBuf,
    stop: Arc<AtomicBool>,
    checker: Arc<Mutex<Checker>>,
    ready: std::sync::mpsc::Sender<()>,
) {
    let mut from: Option<i64> = None;
    while !stop.load(Ordering::SeqCst) {
        // The server may be restarting (a new port, a new kubeconfig): try again shortly.
        let Ok(client) = HttpClient::from_kubeconfig(&kubeconfig) else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Some(pods) = list(&client, "pods").await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        learn_nodes(&client, &checker).await;
        let now: i64 = pods["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        match from {
            None => {
                let mut c = checker.lock();
                for p in pods["items"].as_array().into_iter().flatten() {
                    c.pod("ADDED", p);
                }
                c.revision = c.revision.max(now);
                from = Some(now);
                let _ = ready.send(());
            }
            Some(seen) if now < seen => {
                checker.lock().violations.push(format!(
                    "acknowledged writes lost: the server is at revision {now}, the watch had seen {seen}"
                ));
                from = Some(now);
            }
            Some(_) => checker.lock().resumes += 1,
        }
        let mut req = ApiRequest::new(Verb::Watch, resource("pods"));
        req.params.resource_version = from.map(|r| r.to_string());
        let Ok(mut events) = client.watch(req).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        loop {
            let next = tokio::time::timeout(Duration::from_millis(200), events.next()).await;
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let ev = match next {
                Err(_) => continue, // quiet: look at the stop flag again
                Ok(None) => break,  // the server went away or ended the watch
                Ok(Some(ev)) => ev.into_value(),
            };
            let ty = ev["type"].as_str().unwrap_or_default();
            if ty == "ERROR" {
                // 410: history compacted past where this watch was; start from a new list.
                from = None;
                break;
            }
            if ty == "BOOKMARK" {
                continue;
            }
            let pod = &ev["object"];
            if let Some(node) = pod["spec"]["nodeName"].as_str()
                && !checker.lock().knows(node)
            {
                learn_nodes(&client, &checker).await;
            }
            let rv = pod["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse::<i64>().ok());
            checker.lock().pod(ty, pod);
            // This server's own revision (several servers may share the checker).
            if let Some(rv) = rv {
                from = Some(from.map_or(rv, |f| f.max(rv)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(name: &str) -> Value {
        json!({"metadata": {"name": name}, "status": {"allocatable": {"cpu": "1", "memory": "1Gi", "pods": "2"}}})
    }

    fn pod(uid: &str, node: Option<&str>, cpu: &str, rv: i64) -> Value {
        json!({"metadata": {"name": uid, "uid": uid, "resourceVersion": rv.to_string()},
            "spec": {"nodeName": node, "containers": [{"resources": {"requests": {"cpu": cpu, "memory": "100Mi"}}}]},
            "status": {"phase": "Running"}})
    }

    /// The checker itself can fail: each invariant broken once.
    #[test]
    fn each_broken_invariant_is_reported() {
        let mut c = Checker::default();
        c.node(&node("n1"));
        c.node(&node("n2"));
        c.pod("ADDED", &pod("a", None, "600m", 1));
        c.pod("MODIFIED", &pod("a", Some("n1"), "600m", 2));
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        c.pod("ADDED", &pod("b", Some("n1"), "600m", 3));
        assert_eq!(c.violations.len(), 1, "cpu over: {:?}", c.violations);
        c.pod("DELETED", &pod("b", Some("n1"), "600m", 4));
        c.pod("MODIFIED", &pod("a", Some("n2"), "600m", 5));
        assert_eq!(c.violations.len(), 2, "moved: {:?}", c.violations);
        c.pod("ADDED", &pod("c", Some("n2"), "1m", 6));
        assert_eq!(c.violations.len(), 2, "two pods fit: {:?}", c.violations);
        c.pod("ADDED", &pod("d", Some("n2"), "1m", 7));
        assert_eq!(c.violations.len(), 3, "pods over: {:?}", c.violations);
        c.pod("ADDED", &pod("f", Some("ghost"), "1m", 10));
        assert_eq!(c.violations.len(), 4, "unknown node: {:?}", c.violations);
        assert_eq!(c.revision, 10);
    }

    fn member(uid: &str, gang: &str, node: Option<&str>, rv: i64) -> Value {
        let mut p = pod(uid, node, "1m", rv);
        p["metadata"]["namespace"] = json!("ns");
        p["metadata"]["labels"] = json!({"scheduling.x-k8s.io/pod-group": gang});
        p
    }

    /// A gang bound at one revision passes; one bound over two revisions is reported.
    #[test]
    fn a_partly_bound_gang_is_reported() {
        let mut c = Checker::default();
        c.node(&json!({"metadata": {"name": "n1"},
            "status": {"allocatable": {"cpu": "8", "memory": "8Gi", "pods": "110"}}}));
        c.gang("ns/whole", 2);
        c.gang("ns/split", 2);
        c.pod("MODIFIED", &member("w1", "whole", Some("n1"), 5));
        c.pod("MODIFIED", &member("w2", "whole", Some("n1"), 5));
        c.pod("MODIFIED", &member("s1", "split", Some("n1"), 6));
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        c.pod("MODIFIED", &member("s2", "split", Some("n1"), 7));
        assert_eq!(
            c.violations,
            ["gang ns/split partly bound at revision 6: 1 of minMember 2"]
        );
        c.check_gangs();
        assert_eq!(c.violations.len(), 1, "both bound by the end");
    }
}
