//! The JSON the server writes, in the order Kubernetes writes it and without null members.
//!
//! `serde_json::Value` keeps an object's keys sorted, so an object written from it reads
//! `{"apiVersion":…,"kind":…,"metadata":…}` and a `Status` `{"apiVersion":…,"code":409,…}`.
//! Kubernetes writes its Go structs' field order — `kind`, `apiVersion`, `metadata` (name,
//! namespace, uid, resourceVersion, …), `spec`, `status`, and a `Status` as `kind`,
//! `apiVersion`, `metadata`, `status`, `message`, `reason`, `details`, `code` — and clients that
//! compare bodies see the difference. This module writes the envelope (the top level, metadata,
//! a Status' details and causes) in Kubernetes' order; fields nested deeper keep the order of
//! the kind's Rust type. A member whose value is null is left out everywhere, as Kubernetes
//! leaves out unset fields.

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Map, Value};

/// A top-level object: TypeMeta, ObjectMeta, then spec; status last.
const OBJECT: &[&str] = &["kind", "apiVersion", "metadata", "spec", "items"];
/// Kept for the end of an object.
const OBJECT_LAST: &str = "status";
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

/// Where a key goes among its siblings: by its place in `order`, the others after them in
/// their (sorted) order, and `last` at the very end. With `empty_rv`, `resourceVersion` is
/// written as `""` whether the map has one or not.
fn ranked<'a>(
    map: &'a Map<String, Value>,
    order: &[&str],
    last: &str,
    empty_rv: bool,
) -> Vec<(usize, &'a str, &'a Value)> {
    // Each key's rank computed once (not in every comparison of the sort).
    let rank = |k: &str| match order.iter().position(|o| *o == k) {
        Some(i) => i,
        None if k == last => usize::MAX,
        None => order.len(),
    };
    let mut fields: Vec<(usize, &str, &Value)> = map
        .iter()
        .filter(|(k, v)| !(v.is_null() || empty_rv && *k == "resourceVersion"))
        .map(|(k, v)| (rank(k), k.as_str(), v))
        .collect();
    if empty_rv {
        fields.push((rank("resourceVersion"), "resourceVersion", &EMPTY));
    }
    // A stable sort keeps the map's own (sorted) order among equal ranks.
    fields.sort_by_key(|(r, _, _)| *r);
    fields
}

/// A value written without its null members, keys in the value's own order.
pub struct NoNulls<'a>(pub &'a Value);

impl Serialize for NoNulls<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(m) => {
                let mut map = s.serialize_map(None)?;
                for (k, v) in m.iter().filter(|(_, v)| !v.is_null()) {
                    map.serialize_entry(k, &NoNulls(v))?;
                }
                map.end()
            }
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    seq.serialize_element(&NoNulls(v))?;
                }
                seq.end()
            }
            other => other.serialize(s),
        }
    }
}

/// A map written with `order` (then the rest; `last` at the end); each value by `inner`.
struct Ordered<'a> {
    map: &'a Map<String, Value>,
    order: &'static [&'static str],
    last: &'static str,
    empty_rv: bool,
    inner: fn(&str, &'a Value) -> Envelope<'a>,
}

impl Serialize for Ordered<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for (_, k, v) in ranked(self.map, self.order, self.last, self.empty_rv) {
            map.serialize_entry(k, &(self.inner)(k, v))?;
        }
        map.end()
    }
}

/// One level of the envelope: ordered where Kubernetes' order is known, plain below.
enum Envelope<'a> {
    Ordered(Ordered<'a>),
    List(&'a [Value], fn(&'a Value) -> Envelope<'a>),
    Plain(NoNulls<'a>),
}

impl Serialize for Envelope<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Envelope::Ordered(o) => o.serialize(s),
            Envelope::Plain(v) => v.serialize(s),
            Envelope::List(items, each) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for v in *items {
                    seq.serialize_element(&each(v))?;
                }
                seq.end()
            }
        }
    }
}

fn ordered<'a>(
    v: &'a Value,
    order: &'static [&'static str],
    last: &'static str,
    inner: fn(&str, &'a Value) -> Envelope<'a>,
) -> Envelope<'a> {
    match v {
        Value::Object(map) => Envelope::Ordered(Ordered {
            map,
            order,
            last,
            empty_rv: false,
            inner,
        }),
        other => Envelope::Plain(NoNulls(other)),
    }
}

fn plain<'a>(_: &str, v: &'a Value) -> Envelope<'a> {
    Envelope::Plain(NoNulls(v))
}

fn cause(v: &Value) -> Envelope<'_> {
    ordered(v, CAUSE, "", plain)
}

fn details_field<'a>(k: &str, v: &'a Value) -> Envelope<'a> {
    match (k, v) {
        ("causes", Value::Array(items)) => Envelope::List(items, cause),
        _ => Envelope::Plain(NoNulls(v)),
    }
}

fn object_field<'a>(k: &str, v: &'a Value) -> Envelope<'a> {
    match (k, v) {
        ("metadata", _) => ordered(v, METADATA, "", plain),
        ("items", Value::Array(items)) => Envelope::List(items, object),
        _ => Envelope::Plain(NoNulls(v)),
    }
}

fn status_field<'a>(k: &str, v: &'a Value) -> Envelope<'a> {
    match k {
        "details" => ordered(v, DETAILS, "", details_field),
        _ => object_field(k, v),
    }
}

/// A Kubernetes object (or list, or Status) as its envelope is ordered.
fn object(v: &Value) -> Envelope<'_> {
    if v.get("kind").and_then(Value::as_str) == Some("Status") {
        ordered(v, STATUS, "", status_field)
    } else {
        ordered(v, OBJECT, OBJECT_LAST, object_field)
    }
}

/// Writes `v` (an object, a list of them or a `Status`) in Kubernetes' field order, without
/// null members.
pub fn write(out: &mut Vec<u8>, v: &Value) -> Result<(), serde_json::Error> {
    serde_json::to_writer(out, &object(v))
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
/// `"resourceVersion"` key of the bytes: only strings (kind, apiVersion, name, generateName,
/// namespace, selfLink, uid) come before it, and a JSON string cannot hold an unescaped quote.
pub const STORED_RV: &[u8] = br#""resourceVersion":"""#;

fn stored_field<'a>(k: &str, v: &'a Value) -> Envelope<'a> {
    match (k, v) {
        ("metadata", Value::Object(map)) => Envelope::Ordered(Ordered {
            map,
            order: METADATA,
            last: "",
            empty_rv: true,
            inner: plain,
        }),
        _ => Envelope::Plain(NoNulls(v)),
    }
}

/// Writes an object as it is stored: as [`write`] does, with `metadata.resourceVersion` empty
/// (see [`STORED_RV`]). The object must have a `metadata` object.
pub fn write_stored(out: &mut Vec<u8>, obj: &Value) -> Result<(), serde_json::Error> {
    serde_json::to_writer(out, &ordered(obj, OBJECT, OBJECT_LAST, stored_field))
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
    fn an_object_is_written_kind_first_metadata_in_order_status_last_without_nulls() {
        let pod = json!({
            "status": {"phase": "Pending", "podIP": null},
            "spec": {"containers": [{"name": "c", "ports": null}], "initContainers": null},
            "metadata": {"uid": "u", "namespace": "n", "name": "p", "labels": {"a": "b"},
                         "resourceVersion": "7", "creationTimestamp": "t"},
            "kind": "Pod", "apiVersion": "v1", "zz": 1,
        });
        assert_eq!(
            to_string(&pod),
            r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"n","uid":"u","resourceVersion":"7","creationTimestamp":"t","labels":{"a":"b"}},"spec":{"containers":[{"name":"c"}]},"zz":1,"status":{"phase":"Pending"}}"#
        );
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
