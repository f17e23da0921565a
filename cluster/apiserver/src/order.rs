//! The JSON the server writes, in the order Kubernetes writes it and without null members.
//!
//! `serde_json::Value` keeps an object's keys sorted, so an object written from it reads
//! `{"apiVersion":…,"kind":…,"metadata":…}` and a `Status` `{"apiVersion":…,"code":409,…}`.
//! Kubernetes writes its Go structs' fields in declaration order — `kind`, `apiVersion`,
//! `metadata` (name, namespace, uid, resourceVersion, …), `spec` (for a pod: volumes,
//! initContainers, containers, …), `status` — and clients that compare bodies see the
//! difference. This module writes every level of a stored kind in that order, from a table
//! generated from Kubernetes' generated.proto files (`field_order.rs`, which declare fields in
//! the Go structs' order); a `Status` as `kind`, `apiVersion`, `metadata`, `status`, `message`,
//! `reason`, `details`, `code`. Keys a type does not declare (map keys, free-form objects,
//! Tessera's own kinds below their envelope) keep their sorted order. Map keys are sorted, as
//! Go's encoder sorts them. A member whose value is null is left out everywhere, as
//! Kubernetes leaves out unset fields.

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Map, Value};

use crate::field_order::{KINDS, MESSAGES};

/// A message of `field_order.rs`: its fields in Go's order, each with its own message.
pub struct Message {
    /// The full proto name (`api.core.v1.PodSpec`).
    pub name: &'static str,
    /// (the field's proto name without underscores, its message's index or [`NONE`]).
    pub fields: &'static [(&'static str, u16)],
}

/// No message: a scalar, a map or a list of scalars.
pub const NONE: u16 = u16::MAX;

/// Envelope of a kind `field_order.rs` does not know (Tessera's own): TypeMeta, ObjectMeta,
/// then spec; status last.
const OBJECT: &[&str] = &["kind", "apiVersion", "metadata", "spec", "items"];
/// `meta/v1.Status`.
const STATUS: &[&str] = &[
    "kind",
    "apiVersion",
    "metadata",
    "status",
    "message",
    "reason",
    "details",
    "code",
];
/// `meta/v1.ObjectMeta`, and `ListMeta` (selfLink, resourceVersion, continue, ...).
const METADATA: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "continue",
    "remainingItemCount",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];
/// `meta/v1.StatusDetails`.
const DETAILS: &[&str] = &[
    "name",
    "group",
    "kind",
    "uid",
    "causes",
    "retryAfterSeconds",
];
/// `meta/v1.StatusCause`.
const CAUSE: &[&str] = &["reason", "message", "field"];

/// The empty resourceVersion of a stored object (see [`write_stored`]).
static EMPTY: Value = Value::String(String::new());

/// How one value is ordered.
#[derive(Clone, Copy)]
enum Shape {
    /// Keys as they are (sorted), nulls left out, all the way down.
    Plain,
    /// A top-level object: a Status, a list, or an object of a kind (looked up by its kind).
    Object,
    /// ObjectMeta; with `true`, resourceVersion written empty (the stored form).
    Metadata(bool),
    /// A message of `field_order.rs`.
    Message(u16),
    /// `StatusDetails`.
    Details,
    /// `StatusCause`.
    Cause,
}

/// A key's place: (rank, key, value, the shape of its value).
type Ranked<'a> = (usize, &'a str, &'a Value, Shape);

fn position(order: &[&str], key: &str) -> Option<usize> {
    order.iter().position(|o| *o == key)
}

/// Where `key` goes in message `m`, and its message.
fn in_message(m: u16, key: &str) -> Option<(usize, u16)> {
    let fields = MESSAGES.get(usize::from(m))?.fields;
    fields
        .iter()
        .enumerate()
        .find_map(|(i, (name, child))| folded_eq(name, key).then_some((i, *child)))
}

/// `folded` (a proto name without underscores) against a JSON key, ignoring ASCII case.
fn folded_eq(folded: &str, key: &str) -> bool {
    folded.len() == key.len() && folded.eq_ignore_ascii_case(key)
}

/// The message of a kind, from the object's `apiVersion` and `kind`.
fn message_of(obj: &Map<String, Value>) -> Option<u16> {
    let kind = obj.get("kind")?.as_str()?;
    let api_version = obj.get("apiVersion")?.as_str()?;
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    KINDS
        .iter()
        .find(|(g, k, _)| *g == group && *k == kind)
        .map(|(_, _, m)| *m)
}

fn child(m: u16) -> Shape {
    if m == NONE {
        Shape::Plain
    } else {
        Shape::Message(m)
    }
}

/// The members of `map` in the order `shape` gives, nulls left out.
fn ranked<'a>(map: &'a Map<String, Value>, shape: Shape) -> Vec<Ranked<'a>> {
    let unknown = usize::MAX / 2;
    let mut fields: Vec<Ranked<'a>> = Vec::with_capacity(map.len() + 1);
    let mut empty_rv = false;
    match shape {
        Shape::Plain => {
            fields.extend(
                map.iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (0, k.as_str(), v, Shape::Plain)),
            );
            return fields;
        }
        Shape::Object if map.get("kind").and_then(Value::as_str) == Some("Status") => {
            for (k, v) in map.iter().filter(|(_, v)| !v.is_null()) {
                let rank = position(STATUS, k).unwrap_or(unknown);
                let shape = match k.as_str() {
                    "details" => Shape::Details,
                    "metadata" => Shape::Metadata(false),
                    _ => Shape::Plain,
                };
                fields.push((rank, k, v, shape));
            }
        }
        Shape::Object => {
            let message = message_of(map);
            for (k, v) in map.iter().filter(|(_, v)| !v.is_null()) {
                let (rank, shape) = match (k.as_str(), message) {
                    ("kind", _) => (0, Shape::Plain),
                    ("apiVersion", _) => (1, Shape::Plain),
                    ("metadata", _) => (2, Shape::Metadata(false)),
                    ("items", _) => (3, Shape::Object),
                    (_, Some(m)) => match in_message(m, k) {
                        Some((i, c)) => (4 + i, child(c)),
                        None => (unknown, Shape::Plain),
                    },
                    ("status", None) => (usize::MAX, Shape::Plain),
                    (_, None) => (position(OBJECT, k).unwrap_or(unknown), Shape::Plain),
                };
                fields.push((rank, k, v, shape));
            }
        }
        Shape::Metadata(stored) => {
            empty_rv = stored;
            for (k, v) in map.iter().filter(|(_, v)| !v.is_null()) {
                if !(stored && k == "resourceVersion") {
                    fields.push((position(METADATA, k).unwrap_or(unknown), k, v, Shape::Plain));
                }
            }
        }
        Shape::Message(m) => {
            for (k, v) in map.iter().filter(|(_, v)| !v.is_null()) {
                let (rank, shape) =
                    in_message(m, k).map_or((unknown, Shape::Plain), |(i, c)| (i, child(c)));
                fields.push((rank, k, v, shape));
            }
        }
        Shape::Details => {
            for (k, v) in map.iter().filter(|(_, v)| !v.is_null()) {
                let shape = if k == "causes" {
                    Shape::Cause
                } else {
                    Shape::Plain
                };
                fields.push((position(DETAILS, k).unwrap_or(unknown), k, v, shape));
            }
        }
        Shape::Cause => {
            for (k, v) in map.iter().filter(|(_, v)| !v.is_null()) {
                fields.push((position(CAUSE, k).unwrap_or(unknown), k, v, Shape::Plain));
            }
        }
    }
    if empty_rv {
        let rank = position(METADATA, "resourceVersion").unwrap_or(unknown);
        fields.push((rank, "resourceVersion", &EMPTY, Shape::Plain));
    }
    // A stable sort keeps the map's own (sorted) order among equal ranks.
    fields.sort_by_key(|f| f.0);
    fields
}

/// A value written in `shape`'s order; a list's items each in the same shape.
struct Shaped<'a>(&'a Value, Shape);

impl Serialize for Shaped<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(m) => {
                let mut map = s.serialize_map(None)?;
                for (_, k, v, shape) in ranked(m, self.1) {
                    map.serialize_entry(k, &Shaped(v, shape))?;
                }
                map.end()
            }
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    seq.serialize_element(&Shaped(v, self.1))?;
                }
                seq.end()
            }
            other => other.serialize(s),
        }
    }
}

/// Writes `v` (an object, a list of them or a `Status`) in Kubernetes' field order, without
/// null members.
pub fn write(out: &mut Vec<u8>, v: &Value) -> Result<(), serde_json::Error> {
    serde_json::to_writer(out, &Shaped(v, Shape::Object))
}

/// [`write`] into a new string.
pub fn to_string(v: &Value) -> String {
    let mut out = Vec::with_capacity(256);
    // Writing a Value into memory cannot fail: every key is a string.
    if write(&mut out, v).is_err() {
        return v.to_string();
    }
    String::from_utf8(out).unwrap_or_else(|_| v.to_string())
}

/// Where the revision goes in a stored object: metadata's resourceVersion, empty. The store's
/// revision is unknown until the write commits, so objects are stored with this and the
/// revision is spliced in between its last two quotes when read. It is the first
/// `"resourceVersion"` key after `"metadata":{`: only strings (kind, apiVersion, name,
/// generateName, namespace, selfLink, uid) come before it, and a JSON string cannot hold an
/// unescaped quote.
pub const STORED_RV: &[u8] = br#""resourceVersion":"""#;

/// The top level of a stored object: as [`Shape::Object`], with the stored metadata.
struct Stored<'a>(&'a Map<String, Value>);

impl Serialize for Stored<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for (_, k, v, shape) in ranked(self.0, Shape::Object) {
            let shape = match shape {
                Shape::Metadata(_) => Shape::Metadata(true),
                other => other,
            };
            map.serialize_entry(k, &Shaped(v, shape))?;
        }
        map.end()
    }
}

/// Writes an object as it is stored: as [`write`] does, with `metadata.resourceVersion` empty
/// (see [`STORED_RV`]). The object must have a `metadata` object.
pub fn write_stored(out: &mut Vec<u8>, obj: &Value) -> Result<(), serde_json::Error> {
    match obj {
        Value::Object(map) => serde_json::to_writer(out, &Stored(map)),
        other => serde_json::to_writer(out, &Shaped(other, Shape::Plain)),
    }
}

/// Where the revision goes in stored bytes written by [`write_stored`] (or by the earlier
/// layout that put `{"metadata":{"resourceVersion":""` first): the offset of the closing quote
/// of the empty resourceVersion.
pub fn stored_rv_offset(stored: &[u8]) -> Option<usize> {
    let meta = memchr::memmem::find(stored, br#""metadata":{"#)?;
    let at = memchr::memmem::find(&stored[meta..], STORED_RV)?;
    Some(meta + at + STORED_RV.len() - 1)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_status_is_written_as_kubernetes_writes_it() {
        let status = json!({
            "code": 422, "reason": "Invalid", "message": "m", "status": "Failure",
            "metadata": {}, "apiVersion": "v1", "kind": "Status",
            "details": {"kind": "pods", "causes": [{"field": "f", "message": "x", "reason": "R"}], "name": "p"},
        });
        assert_eq!(
            to_string(&status),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"m","reason":"Invalid","details":{"name":"p","kind":"pods","causes":[{"reason":"R","message":"x","field":"f"}]},"code":422}"#
        );
    }

    #[test]
    fn an_object_is_written_in_go_order_at_every_level_without_nulls() {
        let pod = json!({
            "status": {"podIP": null, "phase": "Pending", "hostIP": "10.0.0.1"},
            "spec": {"restartPolicy": "Always", "containers": [{"name": "c", "ports": null,
                "image": "i", "imagePullPolicy": "Always", "command": ["sh"]}],
                "initContainers": null, "hostIPC": true, "volumes": [], "nodeSelector": {"b": "1", "a": "2"}},
            "metadata": {"uid": "u", "namespace": "n", "name": "p", "labels": {"a": "b"},
                         "resourceVersion": "7", "creationTimestamp": "t"},
            "kind": "Pod", "apiVersion": "v1", "zz": 1,
        });
        // PodSpec: volumes, initContainers, containers, ..., restartPolicy, ..., nodeSelector,
        // ..., hostIPC (matched to host_ipc ignoring case); Container: name, image, command,
        // ..., imagePullPolicy; PodStatus: phase, ..., hostIP. A key no type declares ("zz")
        // goes last; map keys stay sorted.
        assert_eq!(
            to_string(&pod),
            r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"n","uid":"u","resourceVersion":"7","creationTimestamp":"t","labels":{"a":"b"}},"spec":{"volumes":[],"containers":[{"name":"c","image":"i","command":["sh"],"imagePullPolicy":"Always"}],"restartPolicy":"Always","nodeSelector":{"a":"2","b":"1"},"hostIPC":true},"status":{"phase":"Pending","hostIP":"10.0.0.1"},"zz":1}"#
        );
    }

    #[test]
    fn kinds_without_a_table_keep_the_envelope_order() {
        let tenant = json!({"status": {}, "spec": {"weight": 1, "namespaces": ["a"]},
            "metadata": {"name": "t"}, "kind": "Tenant", "apiVersion": "tessera.io/v1alpha1", "zz": 1});
        assert_eq!(
            to_string(&tenant),
            r#"{"kind":"Tenant","apiVersion":"tessera.io/v1alpha1","metadata":{"name":"t"},"spec":{"namespaces":["a"],"weight":1},"zz":1,"status":{}}"#
        );
    }

    #[test]
    fn every_stored_kind_has_its_message() {
        for (group, kind, m) in KINDS {
            let message = &MESSAGES[usize::from(*m)];
            assert!(
                message.name.ends_with(&format!(".{kind}")),
                "{group}/{kind}: {}",
                message.name
            );
            assert_eq!(message.fields[0].0, "metadata", "{kind}: ObjectMeta first");
        }
    }

    #[test]
    fn stored_objects_carry_an_empty_resource_version_to_splice() {
        let pod = json!({"kind": "Pod", "apiVersion": "v1", "spec": {},
            "metadata": {"name": "p", "namespace": "n", "uid": "u", "resourceVersion": "5", "labels": {"resourceVersion": ""}}});
        let mut out = Vec::new();
        write_stored(&mut out, &pod).expect("writes");
        let at = stored_rv_offset(&out).expect("found");
        let mut read = out[..at].to_vec();
        read.extend_from_slice(b"42");
        read.extend_from_slice(&out[at..]);
        assert_eq!(
            String::from_utf8(read).expect("utf8"),
            r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"n","uid":"u","resourceVersion":"42","labels":{"resourceVersion":""}},"spec":{}}"#
        );
        let earlier = br#"{"metadata":{"resourceVersion":"","name":"p"},"kind":"Pod"}"#;
        assert_eq!(stored_rv_offset(earlier), Some(32));
        assert_eq!(stored_rv_offset(br#"{"kind":"Pod"}"#), None);
    }

    #[test]
    fn lists_order_each_item() {
        let list = json!({"items": [{"metadata": {"uid": "u", "name": "a"}, "kind": "Pod"}],
            "metadata": {"resourceVersion": "9", "continue": "c"}, "kind": "PodList", "apiVersion": "v1"});
        assert_eq!(
            to_string(&list),
            r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9","continue":"c"},"items":[{"kind":"Pod","metadata":{"name":"a","uid":"u"}}]}"#
        );
    }
}
