//! Kubernetes Events from controllers, so `kubectl describe` tells what happened to an
//! object. Writing never blocks the caller (a bounded number of writes run in the
//! background; beyond that, events are dropped and counted), and a repeated event (same
//! object, reason and message) increments the first one's `count` instead of piling up.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use parking_lot::Mutex;
use serde_json::json;
use tessera_client::catalog::{RESOURCES, Resource};
use tessera_client::client::{Client, create_typed};
use tessera_client::request::PatchType;
use tessera_core::time::{now_secs, rfc3339};
use tokio::sync::Semaphore;

use crate::metrics::RuntimeMetrics;

/// `Normal` or `Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something went wrong.
    Warning,
}

/// The object an event is about.
#[derive(Clone, Debug)]
pub struct ObjectRef {
    /// `apps/v1`, `v1`.
    pub api_version: String,
    /// `ReplicaSet`.
    pub kind: String,
    /// Namespace (empty for cluster-scoped objects: their events go to `default`).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

impl ObjectRef {
    /// A reference to the object with `meta`.
    pub fn new(api_version: &str, kind: &str, meta: &ObjectMeta) -> ObjectRef {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
        }
    }
}

/// (object uid, reason, message).
type EventId = (String, String, String);
/// (namespace, name, count) of the Event written for an id.
type Written = (String, String, i64);

const MAX_IN_FLIGHT: usize = 256;
const MAX_REMEMBERED: usize = 4096;

/// Writes Events for one component.
#[derive(Clone)]
pub struct Recorder {
    client: Arc<dyn Client>,
    component: String,
    seen: Arc<Mutex<HashMap<EventId, Written>>>,
    in_flight: Arc<Semaphore>,
    metrics: Option<RuntimeMetrics>,
}

fn events() -> &'static Resource {
    RESOURCES
        .iter()
        .find(|r| r.plural == "events" && r.group.is_empty())
        .expect("the catalog serves events")
}

impl Recorder {
    /// A recorder writing as `component` (`replicaset-controller`, `default-scheduler`).
    pub fn new(client: Arc<dyn Client>, component: &str, metrics: Option<RuntimeMetrics>) -> Self {
        Recorder {
            client,
            component: component.into(),
            seen: Arc::new(Mutex::new(HashMap::new())),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            metrics,
        }
    }

    /// Records an event about `obj` in the background.
    pub fn event(&self, obj: &ObjectRef, kind: EventType, reason: &str, message: &str) {
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            tracing::debug!(reason, "too many events in flight; dropping one");
            return;
        };
        let this = self.clone();
        let obj = obj.clone();
        let (reason, message) = (reason.to_owned(), message.to_owned());
        tokio::spawn(async move {
            this.write(&obj, kind, &reason, &message).await;
            drop(permit);
        });
    }

    async fn write(&self, obj: &ObjectRef, kind: EventType, reason: &str, message: &str) {
        let ns = if obj.namespace.is_empty() {
            "default".to_owned()
        } else {
            obj.namespace.clone()
        };
        let now = rfc3339(now_secs());
        let id = (obj.uid.clone(), reason.to_owned(), message.to_owned());
        let repeat = {
            let mut seen = self.seen.lock();
            if seen.len() > MAX_REMEMBERED {
                seen.clear();
            }
            match seen.get_mut(&id) {
                Some((ns, name, count)) => {
                    *count += 1;
                    Some((ns.clone(), name.clone(), *count))
                }
                None => None,
            }
        };
        if let Some((ns, name, count)) = repeat {
            let patch = json!({"count": count, "lastTimestamp": now});
            let done = self
                .client
                .patch(events(), Some(&ns), &name, None, PatchType::Merge, &patch)
                .await;
            if done.is_ok() {
                self.count();
                return;
            }
            // The first one is gone (expired or deleted): write a new one.
        }
        let name = format!(
            "{}.{:016x}",
            if obj.name.is_empty() {
                "event"
            } else {
                &obj.name
            },
            rand::random::<u64>()
        );
        let at = k8s_openapi::jiff::Timestamp::from_second(now_secs())
            .ok()
            .map(Time);
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some(obj.api_version.clone()),
                kind: Some(obj.kind.clone()),
                namespace: Some(obj.namespace.clone()),
                name: Some(obj.name.clone()),
                uid: Some(obj.uid.clone()),
                ..ObjectReference::default()
            },
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            type_: Some(
                match kind {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: None,
            }),
            reporting_component: Some(self.component.clone()),
            first_timestamp: at.clone(),
            last_timestamp: at,
            count: Some(1),
            ..Event::default()
        };
        match create_typed(&*self.client, events(), Some(&ns), &ev).await {
            Ok(_) => {
                self.seen.lock().insert(id, (ns, name, 1));
                self.count();
            }
            Err(e) => tracing::debug!(error = %e.message, "could not write an event"),
        }
    }

    fn count(&self) {
        if let Some(m) = &self.metrics {
            m.events_written.with_label_values(&[&self.component]).inc();
        }
    }
}
