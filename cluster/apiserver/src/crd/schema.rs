//! A CustomResourceDefinition's structural schema, compiled once per CRD version into a flat
//! tree of nodes, and what the API server does with it to every custom object, in
//! Kubernetes' order: prune the fields the schema does not declare, apply defaults, then
//! validate (types, required, enums, patterns, bounds, `x-kubernetes-list-type`).
//!
//! The tree is a `Vec<Node>` indexed by position: a walk follows indices, never looks up a
//! definition by name, and a schema is compiled when its CRD changes, not per request.

use std::collections::HashSet;

use regex::Regex;
use serde_json::Value;

use crate::status::Cause;

/// JSON types a node may declare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ty {
    Object,
    Array,
    String,
    Integer,
    Number,
    Boolean,
    /// No `type`: only allowed under `x-kubernetes-int-or-string`,
    /// `x-kubernetes-preserve-unknown-fields`, or in a value validation (`anyOf` …).
    Any,
}

impl Ty {
    fn name(self) -> &'static str {
        match self {
            Ty::Object => "object",
            Ty::Array => "array",
            Ty::String => "string",
            Ty::Integer => "integer",
            Ty::Number => "number",
            Ty::Boolean => "boolean",
            Ty::Any => "any",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ListType {
    Atomic,
    Set,
    Map(Vec<String>),
}

/// One schema node.
#[derive(Debug)]
struct Node {
    ty: Ty,
    nullable: bool,
    /// Declared fields, sorted by name.
    properties: Vec<(String, usize)>,
    /// `additionalProperties`: a schema for every other key (`Some`), or `true` (`Any`).
    additional: Additional,
    items: Option<usize>,
    required: Vec<String>,
    enumeration: Vec<Value>,
    pattern: Option<(String, Regex)>,
    format: Option<String>,
    minimum: Option<(f64, bool)>,
    maximum: Option<(f64, bool)>,
    multiple_of: Option<f64>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    min_items: Option<u64>,
    max_items: Option<u64>,
    min_properties: Option<u64>,
    max_properties: Option<u64>,
    unique_items: bool,
    default: Option<Value>,
    preserve_unknown: bool,
    int_or_string: bool,
    embedded: bool,
    list_type: ListType,
    all_of: Vec<usize>,
    any_of: Vec<usize>,
    one_of: Vec<usize>,
    not: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Additional {
    No,
    Any,
    Node(usize),
}

/// A compiled structural schema.
#[derive(Debug)]
pub struct Schema {
    nodes: Vec<Node>,
    /// `x-kubernetes-validations` (CEL) rules in it, which this server does not evaluate.
    pub unenforced_rules: usize,
}

/// Schemas nest at most this deep (a body is refused deeper, as an error, not a stack
/// overflow).
const MAX_DEPTH: usize = 64;

fn field(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

impl Schema {
    /// Compiles `openAPIV3Schema`. Errors name the schema's field path, as the CRD's
    /// validation reports them (`spec.versions[0].schema.openAPIV3Schema.properties[spec]…`).
    pub fn compile(raw: &Value, at: &str) -> Result<Schema, Vec<Cause>> {
        let mut s = Schema {
            nodes: Vec::new(),
            unenforced_rules: 0,
        };
        let mut errors = Vec::new();
        s.node(raw, at, 0, false, &mut errors);
        if let Some(root) = s.nodes.first()
            && root.ty != Ty::Object
        {
            errors.push(Cause {
                reason: "FieldValueInvalid",
                field: format!("{at}.type"),
                message: "Invalid value: \"object\": must be object at the root".into(),
            });
        }
        if errors.is_empty() {
            Ok(s)
        } else {
            Err(errors)
        }
    }

    fn node(
        &mut self,
        raw: &Value,
        at: &str,
        depth: usize,
        in_validation: bool,
        errors: &mut Vec<Cause>,
    ) -> usize {
        let index = self.nodes.len();
        self.nodes.push(Node {
            ty: Ty::Any,
            nullable: false,
            properties: Vec::new(),
            additional: Additional::No,
            items: None,
            required: Vec::new(),
            enumeration: Vec::new(),
            pattern: None,
            format: None,
            minimum: None,
            maximum: None,
            multiple_of: None,
            min_length: None,
            max_length: None,
            min_items: None,
            max_items: None,
            min_properties: None,
            max_properties: None,
            unique_items: false,
            default: None,
            preserve_unknown: false,
            int_or_string: false,
            embedded: false,
            list_type: ListType::Atomic,
            all_of: Vec::new(),
            any_of: Vec::new(),
            one_of: Vec::new(),
            not: None,
        });
        let mut invalid = |f: &str, v: &Value, why: &str| {
            errors.push(Cause {
                reason: "FieldValueInvalid",
                field: field(at, f),
                message: format!("Invalid value: {v}: {why}"),
            });
        };
        if depth > MAX_DEPTH {
            invalid("", &Value::Null, "the schema nests too deep");
            return index;
        }
        let Some(o) = raw.as_object() else {
            invalid("", raw, "must be a schema object");
            return index;
        };
        let preserve = o.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
        let int_or_string = o.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
        let ty = match o.get("type").and_then(Value::as_str) {
            Some("object") => Ty::Object,
            Some("array") => Ty::Array,
            Some("string") => Ty::String,
            Some("integer") => Ty::Integer,
            Some("number") => Ty::Number,
            Some("boolean") => Ty::Boolean,
            None | Some("") => {
                if !(in_validation || preserve || int_or_string) {
                    errors.push(Cause {
                        reason: "FieldValueRequired",
                        field: field(at, "type"),
                        message: "Required value: must not be empty for specified object fields"
                            .into(),
                    });
                }
                Ty::Any
            }
            Some(other) => {
                errors.push(Cause {
                    reason: "FieldValueNotSupported",
                    field: field(at, "type"),
                    message: format!(
                        "Unsupported value: {other:?}: supported values: \"array\", \"boolean\", \"integer\", \"number\", \"object\", \"string\""
                    ),
                });
                Ty::Any
            }
        };
        if int_or_string && ty != Ty::Any {
            errors.push(Cause {
                reason: "FieldValueForbidden",
                field: field(at, "type"),
                message: "Forbidden: must be empty if x-kubernetes-int-or-string is true".into(),
            });
        }
        let num = |k: &str| o.get(k).and_then(Value::as_f64);
        let count = |k: &str| o.get(k).and_then(Value::as_u64);
        let mut properties = Vec::new();
        if let Some(props) = o.get("properties").and_then(Value::as_object) {
            for (name, sub) in props {
                let child = self.node(
                    sub,
                    &format!("{at}.properties[{name}]"),
                    depth + 1,
                    in_validation,
                    errors,
                );
                properties.push((name.clone(), child));
            }
        }
        let additional = match o.get("additionalProperties") {
            None | Some(Value::Bool(false)) | Some(Value::Null) => Additional::No,
            Some(Value::Bool(true)) => Additional::Any,
            Some(sub) => Additional::Node(self.node(
                sub,
                &format!("{at}.additionalProperties"),
                depth + 1,
                in_validation,
                errors,
            )),
        };
        if !properties.is_empty() && additional != Additional::No {
            errors.push(Cause {
                reason: "FieldValueForbidden",
                field: field(at, "additionalProperties"),
                message: "Forbidden: additionalProperties and properties are mutual exclusive"
                    .into(),
            });
        }
        let items = match o.get("items") {
            None | Some(Value::Null) => None,
            Some(sub) => Some(self.node(
                sub,
                &format!("{at}.items"),
                depth + 1,
                in_validation,
                errors,
            )),
        };
        if ty == Ty::Array && items.is_none() && !in_validation {
            errors.push(Cause {
                reason: "FieldValueRequired",
                field: field(at, "items"),
                message: "Required value: must be specified".into(),
            });
        }
        let sub_list = |key: &str, this: &mut Schema, errors: &mut Vec<Cause>| -> Vec<usize> {
            o.get(key)
                .and_then(Value::as_array)
                .map(|list| {
                    list.iter()
                        .enumerate()
                        .map(|(i, sub)| {
                            this.node(sub, &format!("{at}.{key}[{i}]"), depth + 1, true, errors)
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let all_of = sub_list("allOf", self, errors);
        let any_of = sub_list("anyOf", self, errors);
        let one_of = sub_list("oneOf", self, errors);
        let not = o
            .get("not")
            .filter(|v| !v.is_null())
            .map(|sub| self.node(sub, &format!("{at}.not"), depth + 1, true, errors));
        let pattern = match o.get("pattern").and_then(Value::as_str) {
            Some(p) => match Regex::new(p) {
                Ok(re) => Some((p.to_owned(), re)),
                Err(e) => {
                    errors.push(Cause {
                        reason: "FieldValueInvalid",
                        field: field(at, "pattern"),
                        message: format!(
                            "Invalid value: {p:?}: must be a valid regular expression: {e}"
                        ),
                    });
                    None
                }
            },
            None => None,
        };
        let list_type = match o.get("x-kubernetes-list-type").and_then(Value::as_str) {
            None | Some("atomic") => ListType::Atomic,
            Some("set") => ListType::Set,
            Some("map") => {
                let keys: Vec<String> = o
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|k| {
                        k.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                if keys.is_empty() {
                    errors.push(Cause {
                        reason: "FieldValueRequired",
                        field: field(at, "x-kubernetes-list-map-keys"),
                        message:
                            "Required value: must not be empty if x-kubernetes-list-type is map"
                                .into(),
                    });
                }
                ListType::Map(keys)
            }
            Some(other) => {
                errors.push(Cause {
                    reason: "FieldValueNotSupported",
                    field: field(at, "x-kubernetes-list-type"),
                    message: format!("Unsupported value: {other:?}: supported values: \"atomic\", \"map\", \"set\""),
                });
                ListType::Atomic
            }
        };
        if list_type != ListType::Atomic && ty != Ty::Array {
            errors.push(Cause {
                reason: "FieldValueInvalid",
                field: field(at, "type"),
                message: "Invalid value: must be array if x-kubernetes-list-type is specified"
                    .into(),
            });
        }
        // CEL rules are kept (the CRD is stored as written) but not evaluated: counted, so
        // the CRD's writer is told.
        self.unenforced_rules += o
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        let node = &mut self.nodes[index];
        node.ty = ty;
        node.nullable = o.get("nullable") == Some(&Value::Bool(true));
        properties.sort_by(|a, b| a.0.cmp(&b.0));
        node.properties = properties;
        node.additional = additional;
        node.items = items;
        node.required = o
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        node.enumeration = o
            .get("enum")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        node.pattern = pattern;
        node.format = o.get("format").and_then(Value::as_str).map(str::to_owned);
        let exclusive = |k: &str| o.get(k) == Some(&Value::Bool(true));
        node.minimum = num("minimum").map(|m| (m, exclusive("exclusiveMinimum")));
        node.maximum = num("maximum").map(|m| (m, exclusive("exclusiveMaximum")));
        node.multiple_of = num("multipleOf");
        node.min_length = count("minLength");
        node.max_length = count("maxLength");
        node.min_items = count("minItems");
        node.max_items = count("maxItems");
        node.min_properties = count("minProperties");
        node.max_properties = count("maxProperties");
        node.unique_items = o.get("uniqueItems") == Some(&Value::Bool(true));
        node.default = o.get("default").filter(|d| !d.is_null()).cloned();
        node.preserve_unknown = preserve;
        node.int_or_string = int_or_string;
        node.embedded = o.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true));
        node.list_type = list_type;
        node.all_of = all_of;
        node.any_of = any_of;
        node.one_of = one_of;
        node.not = not;
        index
    }

    fn child(&self, n: usize, key: &str) -> Option<usize> {
        let node = &self.nodes[n];
        match node
            .properties
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
        {
            Ok(i) => Some(node.properties[i].1),
            Err(_) => match node.additional {
                Additional::Node(a) => Some(a),
                _ => None,
            },
        }
    }

    fn keeps_unknown(&self, n: usize) -> bool {
        let node = &self.nodes[n];
        node.preserve_unknown || node.additional == Additional::Any
    }

    /// Removes what the schema does not declare from a custom object (`apiVersion`, `kind`
    /// and `metadata` at the root and in embedded resources are the server's), and returns
    /// the paths removed (`spec.colour`) for `fieldValidation`. Nulls in fields that are not
    /// `nullable` are removed too, as Kubernetes drops them before defaulting.
    pub fn prune(&self, obj: &mut Value) -> Vec<String> {
        let mut removed = Vec::new();
        self.prune_at(0, obj, "", true, &mut removed, 0);
        removed
    }

    fn prune_at(
        &self,
        n: usize,
        v: &mut Value,
        path: &str,
        root: bool,
        removed: &mut Vec<String>,
        depth: usize,
    ) {
        if depth > MAX_DEPTH {
            return;
        }
        match v {
            Value::Object(map) => {
                let keep_unknown = self.keeps_unknown(n);
                let envelope = root || self.nodes[n].embedded;
                let mut gone = Vec::new();
                for (k, child) in map.iter_mut() {
                    if envelope && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                        continue;
                    }
                    let p = field(path, k);
                    match self.child(n, k) {
                        Some(c) => {
                            if child.is_null() && !self.nodes[c].nullable {
                                gone.push(k.clone());
                                continue;
                            }
                            self.prune_at(c, child, &p, false, removed, depth + 1);
                        }
                        None if keep_unknown => {}
                        None => {
                            gone.push(k.clone());
                            removed.push(p);
                        }
                    }
                }
                for k in gone {
                    map.remove(&k);
                }
            }
            Value::Array(items) => {
                if let Some(i) = self.nodes[n].items {
                    for (idx, item) in items.iter_mut().enumerate() {
                        self.prune_at(
                            i,
                            item,
                            &format!("{path}[{idx}]"),
                            false,
                            removed,
                            depth + 1,
                        );
                    }
                }
            }
            _ => {}
        }
    }

    /// Fills in `default`s of missing fields, at every level present in `obj`.
    pub fn default(&self, obj: &mut Value) {
        self.default_at(0, obj, 0);
    }

    fn default_at(&self, n: usize, v: &mut Value, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        match v {
            Value::Object(map) => {
                for (k, c) in &self.nodes[n].properties {
                    if !map.contains_key(k)
                        && let Some(d) = &self.nodes[*c].default
                    {
                        map.insert(k.clone(), d.clone());
                    }
                }
                for (k, child) in map.iter_mut() {
                    if let Some(c) = self.child(n, k) {
                        self.default_at(c, child, depth + 1);
                    }
                }
            }
            Value::Array(items) => {
                if let Some(i) = self.nodes[n].items {
                    for item in items {
                        self.default_at(i, item, depth + 1);
                    }
                }
            }
            _ => {}
        }
    }

    /// Every way `obj` breaks the schema, with Kubernetes' field paths and wording.
    pub fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut out = Vec::new();
        // The root's envelope (`apiVersion`, `kind`, `metadata`) is the server's; the rest
        // is the schema's.
        if obj.is_object() {
            self.check(0, obj, "", &mut out, 0, true);
        }
        out
    }

    /// Checks `v` against node `n`; `envelope`: `v` is the root object, whose `apiVersion`,
    /// `kind` and `metadata` are not the schema's.
    fn check(
        &self,
        n: usize,
        v: &Value,
        path: &str,
        out: &mut Vec<Cause>,
        depth: usize,
        envelope: bool,
    ) {
        if depth > MAX_DEPTH {
            return;
        }
        let node = &self.nodes[n];
        let shown = |v: &Value| match v {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        let at = if path.is_empty() { "<root>" } else { path };
        let invalid = |out: &mut Vec<Cause>, why: String| {
            out.push(Cause {
                reason: "FieldValueInvalid",
                field: path.to_owned(),
                message: format!("Invalid value: {}: {why}", shown(v)),
            });
        };
        if v.is_null() {
            if !node.nullable && node.ty != Ty::Any {
                invalid(
                    out,
                    format!("{at} in body must be of type {}: \"null\"", node.ty.name()),
                );
            }
            return;
        }
        let type_ok = match node.ty {
            Ty::Any if node.int_or_string => v.is_string() || v.is_i64() || v.is_u64(),
            Ty::Any => true,
            Ty::Object => v.is_object(),
            Ty::Array => v.is_array(),
            Ty::String => v.is_string(),
            Ty::Integer => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
            Ty::Number => v.is_number(),
            Ty::Boolean => v.is_boolean(),
        };
        if !type_ok {
            let want = if node.int_or_string {
                "integer or string".to_owned()
            } else {
                node.ty.name().to_owned()
            };
            let got = match v {
                Value::Object(_) => "object",
                Value::Array(_) => "array",
                Value::String(_) => "string",
                Value::Bool(_) => "boolean",
                Value::Number(x) if x.is_f64() => "number",
                Value::Number(_) => "integer",
                Value::Null => "null",
            };
            invalid(
                out,
                format!("{at} in body must be of type {want}: \"{got}\""),
            );
            return;
        }
        if !node.enumeration.is_empty() && !node.enumeration.contains(v) {
            let allowed: Vec<String> = node.enumeration.iter().map(shown).collect();
            out.push(Cause {
                reason: "FieldValueNotSupported",
                field: path.to_owned(),
                message: format!(
                    "Unsupported value: {}: supported values: {}",
                    shown(v),
                    allowed.join(", ")
                ),
            });
        }
        match v {
            Value::String(s) => {
                let len = s.chars().count() as u64;
                if let Some(max) = node.max_length
                    && len > max
                {
                    out.push(Cause {
                        reason: "FieldValueTooLong",
                        field: path.to_owned(),
                        message: format!("Too long: may not be more than {max} bytes"),
                    });
                }
                if let Some(min) = node.min_length
                    && len < min
                {
                    invalid(
                        out,
                        format!("{at} in body should be at least {min} chars long"),
                    );
                }
                if let Some((p, re)) = &node.pattern
                    && !re.is_match(s)
                {
                    invalid(out, format!("{at} in body should match '{p}'"));
                }
                if let Some(why) = node.format.as_deref().and_then(|f| format_problem(f, s)) {
                    invalid(out, format!("{at} in body must be of type {why}"));
                }
            }
            Value::Number(x) => {
                let f = x.as_f64().unwrap_or_default();
                if let Some((max, exclusive)) = node.maximum {
                    if exclusive && f >= max {
                        invalid(out, format!("{at} in body should be less than {max}"));
                    } else if !exclusive && f > max {
                        invalid(
                            out,
                            format!("{at} in body should be less than or equal to {max}"),
                        );
                    }
                }
                if let Some((min, exclusive)) = node.minimum {
                    if exclusive && f <= min {
                        invalid(out, format!("{at} in body should be greater than {min}"));
                    } else if !exclusive && f < min {
                        invalid(
                            out,
                            format!("{at} in body should be greater than or equal to {min}"),
                        );
                    }
                }
                if let Some(m) = node.multiple_of
                    && m > 0.0
                    && (f / m).fract().abs() > 1e-9
                {
                    invalid(out, format!("{at} in body should be a multiple of {m}"));
                }
            }
            Value::Array(items) => {
                let len = items.len() as u64;
                if let Some(max) = node.max_items
                    && len > max
                {
                    out.push(Cause {
                        reason: "FieldValueTooMany",
                        field: path.to_owned(),
                        message: format!("Too many: {len}: must have at most {max} items"),
                    });
                }
                if let Some(min) = node.min_items
                    && len < min
                {
                    invalid(
                        out,
                        format!("{at} in body should have at least {min} items"),
                    );
                }
                match &node.list_type {
                    ListType::Set => duplicates(items, path, |i| Some(i.clone()), out),
                    ListType::Map(keys) => duplicates(
                        items,
                        path,
                        |i| {
                            let o = i.as_object()?;
                            Some(Value::Object(
                                keys.iter()
                                    .filter_map(|k| o.get(k).map(|v| (k.clone(), v.clone())))
                                    .collect(),
                            ))
                        },
                        out,
                    ),
                    ListType::Atomic if node.unique_items => {
                        duplicates(items, path, |i| Some(i.clone()), out)
                    }
                    ListType::Atomic => {}
                }
                if let Some(i) = node.items {
                    for (idx, item) in items.iter().enumerate() {
                        self.check(i, item, &format!("{path}[{idx}]"), out, depth + 1, false);
                    }
                }
            }
            Value::Object(map) => {
                for r in &node.required {
                    if map.get(r).is_none_or(Value::is_null) {
                        out.push(Cause {
                            reason: "FieldValueRequired",
                            field: field(path, r),
                            message: "Required value".into(),
                        });
                    }
                }
                let skipped = |k: &String| {
                    (envelope || node.embedded)
                        && matches!(k.as_str(), "apiVersion" | "kind" | "metadata")
                };
                let len = map.keys().filter(|k| !skipped(k)).count() as u64;
                if let Some(max) = node.max_properties
                    && len > max
                {
                    invalid(
                        out,
                        format!("{at} in body should have at most {max} properties"),
                    );
                }
                if let Some(min) = node.min_properties
                    && len < min
                {
                    invalid(
                        out,
                        format!("{at} in body should have at least {min} properties"),
                    );
                }
                for (k, child) in map {
                    if skipped(k) {
                        continue;
                    }
                    if let Some(c) = self.child(n, k) {
                        self.check(c, child, &field(path, k), out, depth + 1, false);
                    }
                }
                if node.embedded {
                    for k in ["apiVersion", "kind"] {
                        if map.get(k).and_then(Value::as_str).is_none_or(str::is_empty) {
                            out.push(Cause {
                                reason: "FieldValueRequired",
                                field: field(path, k),
                                message: "Required value: must not be empty".into(),
                            });
                        }
                    }
                }
            }
            Value::Bool(_) | Value::Null => {}
        }
        for a in &node.all_of {
            self.check(*a, v, path, out, depth + 1, envelope);
        }
        let passes = |s: usize| {
            let mut scratch = Vec::new();
            self.check(s, v, path, &mut scratch, depth + 1, envelope);
            scratch.is_empty()
        };
        if !node.any_of.is_empty() && !node.any_of.iter().any(|s| passes(*s)) {
            out.push(Cause {
                reason: "FieldValueInvalid",
                field: path.to_owned(),
                message: format!(
                    "Invalid value: {}: {at} in body must match at least one schema in anyOf",
                    shown(v)
                ),
            });
        }
        if !node.one_of.is_empty() && node.one_of.iter().filter(|s| passes(**s)).count() != 1 {
            out.push(Cause {
                reason: "FieldValueInvalid",
                field: path.to_owned(),
                message: format!(
                    "Invalid value: {}: {at} in body must match exactly one schema in oneOf",
                    shown(v)
                ),
            });
        }
        if let Some(not) = node.not
            && passes(not)
        {
            out.push(Cause {
                reason: "FieldValueInvalid",
                field: path.to_owned(),
                message: format!(
                    "Invalid value: {}: {at} in body must not match the schema in not",
                    shown(v)
                ),
            });
        }
    }

    /// The node at a simple dotted path (`.spec.replicas`), for the scale subresource's and
    /// printer columns' paths.
    pub fn has_path(&self, path: &str) -> bool {
        let mut n = 0;
        for part in path.trim_start_matches('.').split('.') {
            if self.keeps_unknown(n) {
                return true;
            }
            match self.child(n, part) {
                Some(c) => n = c,
                None => return false,
            }
        }
        true
    }
}

fn duplicates(
    items: &[Value],
    path: &str,
    key: impl Fn(&Value) -> Option<Value>,
    out: &mut Vec<Cause>,
) {
    let mut seen = HashSet::new();
    for (i, item) in items.iter().enumerate() {
        if let Some(k) = key(item)
            && !seen.insert(k.to_string())
        {
            out.push(Cause {
                reason: "FieldValueDuplicate",
                field: format!("{path}[{i}]"),
                message: format!("Duplicate value: {k}"),
            });
        }
    }
}

/// What is wrong with `s` as a value of the OpenAPI `format` (those Kubernetes checks).
fn format_problem(format: &str, s: &str) -> Option<String> {
    let ok = match format {
        "int32" | "int64" | "float" | "double" | "byte" | "password" | "" => return None,
        "date-time" | "datetime" => s.parse::<jiff::Timestamp>().is_ok(),
        "date" => s.parse::<jiff::civil::Date>().is_ok(),
        "uuid" => {
            s.len() == 36
                && s.char_indices().all(|(i, c)| {
                    if [8, 13, 18, 23].contains(&i) {
                        c == '-'
                    } else {
                        c.is_ascii_hexdigit()
                    }
                })
        }
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "hostname" => tessera_core::names::dns1123_subdomain(s).is_none(),
        _ => return None,
    };
    (!ok).then(|| format!("{format}: {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn widget() -> Schema {
        Schema::compile(
            &json!({
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["size"],
                        "properties": {
                            "size": {"type": "integer", "minimum": 1, "maximum": 10},
                            "colour": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                            "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
                            "ports": {"type": "array", "x-kubernetes-list-type": "map",
                                "x-kubernetes-list-map-keys": ["name"],
                                "items": {"type": "object", "properties": {
                                    "name": {"type": "string"},
                                    "port": {"type": "integer", "default": 80}}}},
                            "tags": {"type": "array", "x-kubernetes-list-type": "set",
                                "items": {"type": "string"}},
                            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                            "port": {"x-kubernetes-int-or-string": true},
                        }
                    },
                    "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
                }
            }),
            "schema",
        )
        .expect("compiles")
    }

    #[test]
    fn unknown_fields_are_pruned_and_reported_but_preserved_where_asked() {
        let s = widget();
        let mut obj = json!({"apiVersion": "x/v1", "kind": "W", "metadata": {"name": "a"},
            "spec": {"size": 2, "colour": "red", "bogus": 1, "extra": {"anything": [1]},
                     "ports": [{"name": "http", "nope": true}]},
            "top": 1});
        let removed = s.prune(&mut obj);
        assert_eq!(removed, vec!["spec.bogus", "spec.ports[0].nope", "top"]);
        assert_eq!(obj["spec"]["extra"]["anything"], json!([1]));
        assert_eq!(obj["metadata"]["name"], "a");
        assert!(obj.get("top").is_none());
    }

    #[test]
    fn defaults_fill_missing_fields_at_every_present_level() {
        let s = widget();
        let mut obj =
            json!({"spec": {"size": 1, "ports": [{"name": "a"}, {"name": "b", "port": 9}]}});
        s.default(&mut obj);
        assert_eq!(obj["spec"]["colour"], "red");
        assert_eq!(obj["spec"]["ports"][0]["port"], 80);
        assert_eq!(obj["spec"]["ports"][1]["port"], 9);
        assert!(
            obj.get("status").is_none(),
            "absent parents are not created"
        );
    }

    #[test]
    fn validation_names_each_field_as_kubernetes_does() {
        let s = widget();
        let fields = |obj: Value| -> Vec<(String, String)> {
            s.validate(&obj)
                .into_iter()
                .map(|c| (c.field, c.message))
                .collect()
        };
        assert!(
            fields(json!({"spec": {"size": 3, "colour": "blue", "name": "abc", "port": "http"}}))
                .is_empty()
        );
        let got = fields(json!({"spec": {"size": "3"}}));
        assert_eq!(got[0].0, "spec.size");
        assert!(
            got[0].1.contains("must be of type integer: \"string\""),
            "{got:?}"
        );
        let got = fields(json!({"spec": {}}));
        assert_eq!(got, vec![("spec.size".into(), "Required value".into())]);
        let got = fields(json!({"spec": {"size": 11, "colour": "pink", "name": "ABC"}}));
        let named: Vec<&str> = got.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            named,
            vec!["spec.colour", "spec.name", "spec.size"],
            "{got:?}"
        );
        assert!(got[0].1.contains("supported values: \"red\", \"blue\""));
        assert!(got[1].1.contains("should match '^[a-z]+$'"));
        assert!(got[2].1.contains("less than or equal to 10"));
        let got = fields(json!({"spec": {"size": 1, "tags": ["a", "a"],
            "ports": [{"name": "x"}, {"name": "x"}], "port": 1.5}}));
        let named: Vec<&str> = got.iter().map(|(f, _)| f.as_str()).collect();
        assert!(
            named.contains(&"spec.tags[1]") && named.contains(&"spec.ports[1]"),
            "{got:?}"
        );
        assert!(
            named.contains(&"spec.port"),
            "int-or-string refuses a fraction: {got:?}"
        );
    }

    #[test]
    fn a_schema_that_is_not_structural_is_refused_with_its_path() {
        let e = Schema::compile(
            &json!({"type": "object", "properties": {"spec": {"properties": {}}}}),
            "s",
        )
        .expect_err("a field without a type");
        assert_eq!(e[0].field, "s.properties[spec].type");
        let e = Schema::compile(&json!({"type": "string"}), "s").expect_err("root must be object");
        assert_eq!(e[0].field, "s.type");
        let e = Schema::compile(
            &json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}),
            "s",
        )
        .expect_err("bad pattern");
        assert_eq!(e[0].field, "s.properties[a].pattern");
        let s = Schema::compile(
            &json!({"type": "object", "x-kubernetes-validations": [{"rule": "self.a > 1"}],
                "properties": {"a": {"type": "integer",
                    "x-kubernetes-validations": [{"rule": "self > 0"}]}}}),
            "s",
        )
        .expect("CEL rules are kept");
        assert_eq!(s.unenforced_rules, 2, "and counted, for the warning");
    }

    #[test]
    fn any_of_one_of_and_not_validate_values() {
        let s = Schema::compile(
            &json!({"type": "object", "properties": {
                "a": {"type": "integer", "anyOf": [{"minimum": 10}, {"maximum": 0}]},
                "b": {"type": "string", "not": {"enum": ["x"]}}}}),
            "s",
        )
        .expect("compiles");
        assert!(s.validate(&json!({"a": 11, "b": "y"})).is_empty());
        assert_eq!(s.validate(&json!({"a": 5, "b": "x"})).len(), 2);
    }

    /// Arbitrary schemas and values: compiling and every operation end without a panic,
    /// pruning twice removes nothing the second time, and defaulting adds nothing pruning
    /// would remove (so a stored object is stable under the server's own steps).
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                (-1e6f64..1e6).prop_map(Value::from),
                "[a-z0-9 ]{0,6}".prop_map(Value::from),
            ];
            leaf.prop_recursive(4, 32, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                    prop::collection::btree_map("[a-c]", inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn schema() -> impl Strategy<Value = Value> {
            let scalar = prop_oneof![
                Just(json!({"type": "string"})),
                Just(
                    json!({"type": "string", "pattern": "^[a-z]*$", "maxLength": 3, "default": "x"})
                ),
                Just(json!({"type": "integer", "minimum": 0, "maximum": 5})),
                Just(json!({"type": "number", "multipleOf": 0.5})),
                Just(json!({"type": "boolean", "default": true})),
                Just(json!({"x-kubernetes-int-or-string": true})),
                Just(json!({"type": "string", "enum": ["a", "b"]})),
                Just(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})),
                Just(json!({"type": "string", "format": "date-time"})),
            ];
            scalar.prop_recursive(4, 24, 3, |inner| {
                prop_oneof![
                    prop::collection::btree_map("[a-c]", inner.clone(), 0..3).prop_map(|m| {
                        let required: Vec<&String> = m.keys().take(1).collect();
                        json!({"type": "object", "properties": m, "required": required})
                    }),
                    inner
                        .clone()
                        .prop_map(|i| json!({"type": "array", "items": i, "maxItems": 3})),
                    inner
                        .clone()
                        .prop_map(|i| json!({"type": "object", "additionalProperties": i})),
                    Just(json!({"type": "array", "x-kubernetes-list-type": "set",
                        "items": {"type": "string"}})),
                    inner.prop_map(
                        |i| json!({"type": "object", "nullable": true, "properties": {"a": i},
                        "anyOf": [{"required": ["a"]}, {"properties": {"a": {"type": "string"}}}]})
                    ),
                ]
            })
        }

        #[test]
        fn schemas_and_values_never_panic_and_settle() {
            let compiled = std::cell::Cell::new(0u32);
            let mut runner =
                proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(512));
            runner
                .run(&(schema(), value()), |(spec, body)| {
                    let raw = json!({"type": "object", "properties": {"spec": spec}});
                    let Ok(s) = Schema::compile(&raw, "schema") else {
                        return Ok(());
                    };
                    compiled.set(compiled.get() + 1);
                    let mut obj =
                        json!({"apiVersion": "x/v1", "kind": "X", "metadata": {}, "spec": body});
                    s.prune(&mut obj);
                    prop_assert!(
                        s.prune(&mut obj.clone()).is_empty(),
                        "pruning settles: {obj}"
                    );
                    s.default(&mut obj);
                    let mut again = obj.clone();
                    prop_assert!(
                        s.prune(&mut again).is_empty(),
                        "defaults are never pruned: {obj}"
                    );
                    for cause in s.validate(&obj) {
                        prop_assert!(cause.field.starts_with("spec"), "{cause:?}");
                        prop_assert!(!cause.message.is_empty());
                    }
                    Ok(())
                })
                .expect("the property holds");
            assert!(
                compiled.get() > 256,
                "most generated schemas compile: {}",
                compiled.get()
            );
        }
    }
}
