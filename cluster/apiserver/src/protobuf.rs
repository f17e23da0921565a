//! Decoding Kubernetes' protobuf request bodies into JSON.
//!
//! kubectl's typed commands (`kubectl create namespace NAME`, `create configmap`, `create
//! secret`, `create deployment`, `create job`, `auth can-i`, ...) send their objects as
//! `application/vnd.kubernetes.protobuf` and do not fall back to JSON. Such a body is the
//! magic `k8s\0` and a `runtime.Unknown` envelope (type meta, raw message bytes); the raw
//! message is decoded here, field by field, with the field numbers of Kubernetes'
//! `generated.proto` files (`protobuf_schema.rs`), into the JSON object the rest of the
//! request path takes. Responses are always JSON (those clients accept it).
//!
//! JSON field names come from the kinds' OpenAPI schemas (Kubernetes' names such as `podIP`
//! are not a plain camel-casing of the protobuf names); `Time`, `Quantity`, `IntOrString`,
//! `FieldsV1` and byte maps take their JSON forms.

use std::collections::HashMap;
use std::sync::OnceLock;

use base64::Engine;
use serde_json::{Map, Value};

use crate::api::rfc3339;
use crate::protobuf_schema::MESSAGES;

/// The wire type of a field, as the schema declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `string`.
    Str,
    /// `int32`.
    I32,
    /// `int64`.
    I64,
    /// `bool`.
    Bool,
    /// `bytes` (base64 in JSON).
    Bytes,
    /// `double` or `float`.
    F64,
    /// A message (`Field::message`).
    Msg,
    /// `map<string, string>`.
    MapStr,
    /// `map<string, bytes>`.
    MapBytes,
    /// `map<string, message>`.
    MapMsg,
}

/// One field of a message.
#[derive(Debug)]
pub struct Field {
    /// Field number.
    pub tag: u32,
    /// The protobuf (snake_case) name.
    pub name: &'static str,
    /// Wire type.
    pub kind: Kind,
    /// `repeated`.
    pub repeated: bool,
    /// For messages and maps of messages: the message's full name.
    pub message: &'static str,
}

/// The content type of Kubernetes' protobuf encoding.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

type Fields = HashMap<u32, &'static Field>;

fn index() -> &'static HashMap<&'static str, Fields> {
    static INDEX: OnceLock<HashMap<&'static str, Fields>> = OnceLock::new();
    INDEX.get_or_init(|| {
        MESSAGES
            .iter()
            .map(|(name, fields)| (*name, fields.iter().map(|f| (f.tag, f)).collect()))
            .collect()
    })
}

/// The protobuf package of an API group-version.
fn package(api_version: &str) -> Option<String> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let short = match group {
        "" => "core",
        // Kubernetes' proto package names the group by its first label:
        // `rbac.authorization.k8s.io` is `k8s.io.api.rbac.v1`.
        g => g.trim_end_matches(".k8s.io").split('.').next().unwrap_or(g),
    };
    Some(format!("api.{short}.{version}"))
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v: u64 = 0;
        for shift in (0..70).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            if shift == 63 && b > 1 {
                return Err("varint overflows 64 bits".into());
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = usize::try_from(self.varint()?).map_err(|_| "length too large")?;
        let end = self.pos.checked_add(len).ok_or("length too large")?;
        let s = self.buf.get(self.pos..end).ok_or("truncated field")?;
        self.pos = end;
        Ok(s)
    }

    fn fixed(&mut self, n: usize) -> Result<&'a [u8], String> {
        let s = self
            .buf
            .get(self.pos..self.pos + n)
            .ok_or("truncated fixed field")?;
        self.pos += n;
        Ok(s)
    }

    fn skip(&mut self, wire: u64) -> Result<(), String> {
        match wire {
            0 => self.varint().map(|_| ()),
            1 => self.fixed(8).map(|_| ()),
            2 => self.bytes().map(|_| ()),
            5 => self.fixed(4).map(|_| ()),
            w => Err(format!("unsupported wire type {w}")),
        }
    }
}

/// The JSON name of protobuf field `name` of message `message`.
fn json_name(message: &str, name: &str) -> String {
    let schema = crate::patch::schema(&format!("io.k8s.{message}"));
    let squashed: String = name.chars().filter(|c| *c != '_').collect();
    if let Some(props) = schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        && let Some(k) = props.keys().find(|k| k.eq_ignore_ascii_case(&squashed))
    {
        return k.clone();
    }
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn scalar(kind: Kind, wire: u64, r: &mut Reader<'_>) -> Result<Value, String> {
    Ok(match (kind, wire) {
        (Kind::Str, 2) => Value::String(
            String::from_utf8(r.bytes()?.to_vec()).map_err(|_| "a string is not UTF-8")?,
        ),
        (Kind::Bytes, 2) => {
            Value::String(base64::engine::general_purpose::STANDARD.encode(r.bytes()?))
        }
        (Kind::I32, 0) => Value::from(r.varint()? as i64 as i32),
        (Kind::I64, 0) => Value::from(r.varint()? as i64),
        (Kind::Bool, 0) => Value::Bool(r.varint()? != 0),
        (Kind::F64, 1) => {
            let b: [u8; 8] = r.fixed(8)?.try_into().map_err(|_| "fixed64")?;
            serde_json::Number::from_f64(f64::from_le_bytes(b)).map_or(Value::Null, Value::Number)
        }
        (Kind::F64, 5) => {
            let b: [u8; 4] = r.fixed(4)?.try_into().map_err(|_| "fixed32")?;
            serde_json::Number::from_f64(f64::from(f32::from_le_bytes(b)))
                .map_or(Value::Null, Value::Number)
        }
        (k, w) => return Err(format!("a {k:?} field arrived with wire type {w}")),
    })
}

/// Decodes one message into its JSON form.
pub fn decode_message(bytes: &[u8], message: &str, depth: usize) -> Result<Value, String> {
    if depth > 64 {
        return Err("messages nested more than 64 deep".into());
    }
    let fields = index()
        .get(message)
        .ok_or_else(|| format!("no protobuf schema for {message}"))?;
    let mut r = Reader { buf: bytes, pos: 0 };
    let mut out = Map::new();
    while !r.done() {
        let key = r.varint()?;
        let (tag, wire) = ((key >> 3) as u32, key & 7);
        let Some(f) = fields.get(&tag) else {
            r.skip(wire)?;
            continue;
        };
        let value = match f.kind {
            Kind::Msg => {
                if wire != 2 {
                    return Err(format!("message field {} with wire type {wire}", f.name));
                }
                decode_message(r.bytes()?, f.message, depth + 1)?
            }
            Kind::MapStr | Kind::MapBytes | Kind::MapMsg => {
                if wire != 2 {
                    return Err(format!("map field {} with wire type {wire}", f.name));
                }
                let entry = r.bytes()?;
                let mut er = Reader { buf: entry, pos: 0 };
                let (mut k, mut v) = (String::new(), Value::Null);
                while !er.done() {
                    let ek = er.varint()?;
                    match (ek >> 3, ek & 7) {
                        (1, 2) => {
                            k = String::from_utf8(er.bytes()?.to_vec())
                                .map_err(|_| "a map key is not UTF-8")?
                        }
                        (2, w) => {
                            v = match f.kind {
                                Kind::MapStr => scalar(Kind::Str, w, &mut er)?,
                                Kind::MapBytes => scalar(Kind::Bytes, w, &mut er)?,
                                _ => decode_message(er.bytes()?, f.message, depth + 1)?,
                            }
                        }
                        (_, w) => er.skip(w)?,
                    }
                }
                let name = json_name(message, f.name);
                let map = out.entry(name).or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(m) = map {
                    m.insert(
                        k,
                        if v.is_null() {
                            Value::String(String::new())
                        } else {
                            v
                        },
                    );
                }
                continue;
            }
            kind if f.repeated && wire == 2 && kind != Kind::Str && kind != Kind::Bytes => {
                // A packed repeated scalar.
                let packed = r.bytes()?;
                let mut pr = Reader {
                    buf: packed,
                    pos: 0,
                };
                let name = json_name(message, f.name);
                while !pr.done() {
                    let wire = if kind == Kind::F64 { 1 } else { 0 };
                    let v = scalar(kind, wire, &mut pr)?;
                    push(&mut out, &name, v);
                }
                continue;
            }
            kind => scalar(kind, wire, &mut r)?,
        };
        let name = json_name(message, f.name);
        if f.repeated {
            push(&mut out, &name, value);
        } else if !value.is_null() && (!is_zero(&value) || KEEP_ZERO.contains(&f.name)) {
            out.insert(name, value);
        }
    }
    Ok(special(message, out))
}

/// Go writes every non-pointer field to protobuf, set or not, while its JSON leaves zero
/// values out (`omitempty`): a zero scalar from protobuf is treated as unset, as it would be
/// in JSON — except these fields, pointers in Go, whose zero is a value the client chose.
const KEEP_ZERO: &[&str] = &[
    "replicas",
    "value",
    "parallelism",
    "completions",
    "backoff_limit",
    "min_ready_seconds",
    "termination_grace_period_seconds",
];

fn is_zero(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

fn push(out: &mut Map<String, Value>, name: &str, v: Value) {
    match out
        .entry(name.to_owned())
        .or_insert_with(|| Value::Array(Vec::new()))
    {
        Value::Array(a) => a.push(v),
        other => *other = Value::Array(vec![v]),
    }
}

/// The JSON forms of the types whose JSON is not their fields.
fn special(message: &str, m: Map<String, Value>) -> Value {
    match message {
        "apimachinery.pkg.apis.meta.v1.Time" | "apimachinery.pkg.apis.meta.v1.MicroTime" => {
            let secs = m.get("seconds").and_then(Value::as_i64).unwrap_or(0);
            if secs == 0 {
                Value::Null
            } else {
                Value::String(rfc3339(secs))
            }
        }
        "apimachinery.pkg.api.resource.Quantity" => m
            .get("string")
            .cloned()
            .unwrap_or(Value::String("0".into())),
        "apimachinery.pkg.util.intstr.IntOrString" => {
            if m.get("type").and_then(Value::as_i64) == Some(1) {
                m.get("strVal")
                    .cloned()
                    .unwrap_or(Value::String(String::new()))
            } else {
                m.get("intVal").cloned().unwrap_or(Value::from(0))
            }
        }
        "apimachinery.pkg.apis.meta.v1.FieldsV1" | "apimachinery.pkg.runtime.RawExtension" => m
            .get("raw")
            .and_then(Value::as_str)
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .and_then(|raw| serde_json::from_slice(&raw).ok())
            .unwrap_or(Value::Null),
        _ => Value::Object(m),
    }
}

/// Decodes a protobuf request body (`k8s\0` + `runtime.Unknown`) into the JSON object it
/// carries, with `apiVersion` and `kind` set.
pub fn decode_body(body: &[u8]) -> Result<Value, String> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or("a protobuf body starts with the bytes k8s\\0")?;
    let mut r = Reader { buf: rest, pos: 0 };
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    while !r.done() {
        let key = r.varint()?;
        match (key >> 3, key & 7) {
            (1, 2) => {
                let mut tr = Reader {
                    buf: r.bytes()?,
                    pos: 0,
                };
                while !tr.done() {
                    let tk = tr.varint()?;
                    match (tk >> 3, tk & 7) {
                        (1, 2) => api_version = String::from_utf8_lossy(tr.bytes()?).into_owned(),
                        (2, 2) => kind = String::from_utf8_lossy(tr.bytes()?).into_owned(),
                        (_, w) => tr.skip(w)?,
                    }
                }
            }
            (2, 2) => raw = r.bytes()?,
            (_, w) => r.skip(w)?,
        }
    }
    if kind.is_empty() {
        return Err("the protobuf envelope names no kind".into());
    }
    let message = if kind == "DeleteOptions" {
        "apimachinery.pkg.apis.meta.v1.DeleteOptions".to_owned()
    } else {
        format!(
            "{}.{kind}",
            package(&api_version).ok_or("the protobuf envelope has no apiVersion")?
        )
    };
    let mut obj = decode_message(raw, &message, 0)?;
    if let Value::Object(m) = &mut obj {
        m.insert("apiVersion".into(), Value::String(api_version));
        m.insert("kind".into(), Value::String(kind));
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn field(tag: u32, payload: &[u8], out: &mut Vec<u8>) {
        varint(u64::from(tag) << 3 | 2, out);
        varint(payload.len() as u64, out);
        out.extend_from_slice(payload);
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut tm = Vec::new();
        field(1, api_version.as_bytes(), &mut tm);
        field(2, kind.as_bytes(), &mut tm);
        let mut body = MAGIC.to_vec();
        field(1, &tm, &mut body);
        field(2, raw, &mut body);
        body
    }

    /// What `kubectl create configmap c --from-literal=a=1` sends, built by hand.
    #[test]
    fn a_configmap_decodes_to_its_json() {
        let mut meta = Vec::new();
        field(1, b"c", &mut meta);
        let mut label = Vec::new();
        field(1, b"app", &mut label);
        field(2, b"web", &mut label);
        field(11, &label, &mut meta);
        let mut entry = Vec::new();
        field(1, b"a", &mut entry);
        field(2, b"1", &mut entry);
        let mut cm = Vec::new();
        field(1, &meta, &mut cm);
        field(2, &entry, &mut cm);
        let obj = decode_body(&envelope("v1", "ConfigMap", &cm)).expect("decodes");
        assert_eq!(
            obj,
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c", "labels": {"app": "web"}}, "data": {"a": "1"}})
        );
    }

    #[test]
    fn json_names_follow_kubernetes_not_camel_case() {
        assert_eq!(json_name("api.core.v1.PodStatus", "pod_ip"), "podIP");
        assert_eq!(
            json_name("api.core.v1.ServiceSpec", "cluster_ip"),
            "clusterIP"
        );
        assert_eq!(
            json_name(
                "api.authorization.v1.SelfSubjectAccessReviewSpec",
                "resource_attributes"
            ),
            "resourceAttributes"
        );
    }

    #[test]
    fn broken_bodies_are_errors() {
        for bad in [
            &b"k8s"[..],
            &b"json"[..],
            &b"k8s\0\x0a\xff"[..],
            &b"k8s\0\x0a\x02\x0a\x05"[..],
        ] {
            assert!(decode_body(bad).is_err(), "{bad:?}");
        }
        let mut ns = Vec::new();
        field(1, &[0x0a, 0x03, b'a', b'b'], &mut ns);
        assert!(
            decode_body(&envelope("v1", "Namespace", &ns)).is_err(),
            "truncated name"
        );
        assert!(decode_body(&envelope("v1", "NoSuchKind", &[])).is_err());
    }
}
