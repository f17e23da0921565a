//! A CustomResourceDefinition's structural schema, compiled once per CRD version into a flat
//! tree of nodes, and what the API server does with it to every custom object, in
//! Kubernetes' order: prune the fields the schema does not declare, apply defaults, then
//! validate (types, required, enums, patterns, bounds, `x-kubernetes-list-type`, and the
//! CEL rules of `x-kubernetes-validations`, with `oldSelf` on updates).
//!
//! The tree is a `Vec<Node>` indexed by position: a walk follows indices, never looks up a
//! definition by name, and a schema is compiled when its CRD changes, not per request.

use std::collections::HashSet;
use std::sync::Arc;

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
    /// `x-kubernetes-validations`, compiled.
    rules: Vec<Arc<Rule>>,
    /// Whether this node or one below it has rules (else a walk need not carry the old
    /// object down).
    rules_below: bool,
}

/// One `x-kubernetes-validations` rule.
#[derive(Debug)]
struct Rule {
    rule: crate::cel::Expression,
    message: Option<String>,
    message_expression: Option<crate::cel::Expression>,
    /// The Cause reason a failure reports.
    reason: &'static str,
    /// Where a failure is reported, below the node (`.spec.replicas`).
    field_path: Option<String>,
    /// Uses `oldSelf`: evaluated on updates only (where the old value correlates).
    transition: bool,
    /// `optionalOldSelf`: evaluated on creates too, with `oldSelf` an optional.
    optional_old_self: bool,
}

/// Rules evaluated by one validation, by result.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RuleTally {
    /// Held.
    pub passed: u64,
    /// Did not hold.
    pub failed: u64,
    /// Could not be evaluated.
    pub errors: u64,
}

thread_local! {
    /// The tally of the validation running on this thread (validation is synchronous, so
    /// one walk's counts cannot mix with another's).
    static RULE_TALLY: std::cell::Cell<RuleTally> = const {
        std::cell::Cell::new(RuleTally { passed: 0, failed: 0, errors: 0 })
    };
}

/// The reasons a rule may report.
const RULE_REASONS: [&str; 4] = [
    "FieldValueInvalid",
    "FieldValueForbidden",
    "FieldValueRequired",
    "FieldValueDuplicate",
];

/// The variables a rule may read.
const RULE_VARIABLES: [&str; 2] = ["self", "oldSelf"];

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
    /// How many `x-kubernetes-validations` rules it holds.
    pub rules: usize,
}

/// Schemas nest at most this deep (a body is refused deeper, as an error, not a stack
/// overflow).
const MAX_DEPTH: usize = 64;

/// Compiles one `x-kubernetes-validations` entry at `at`; problems go to `errors`.
fn compile_rule(raw: &Value, at: &str, errors: &mut Vec<Cause>) -> Option<Rule> {
    let before = errors.len();
    let text = |k: &str| raw.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    let Some(source) = text("rule") else {
        errors.push(Cause {
            reason: "FieldValueRequired",
            field: field(at, "rule"),
            message: "Required value".into(),
        });
        return None;
    };
    let rule = crate::cel::compile(source, &RULE_VARIABLES)
        .map_err(|e| {
            errors.push(Cause {
                reason: "FieldValueInvalid",
                field: field(at, "rule"),
                message: format!("Invalid value: {source:?}: {e}"),
            })
        })
        .ok();
    let message = text("message").map(str::to_owned);
    if let Some(m) = &message
        && m.contains('\n')
    {
        errors.push(Cause {
            reason: "FieldValueInvalid",
            field: field(at, "message"),
            message: format!("Invalid value: {m:?}: message must not contain line breaks"),
        });
    }
    let message_expression = text("messageExpression").and_then(|src| {
        crate::cel::compile(src, &RULE_VARIABLES)
            .map_err(|e| {
                errors.push(Cause {
                    reason: "FieldValueInvalid",
                    field: field(at, "messageExpression"),
                    message: format!("Invalid value: {src:?}: {e}"),
                })
            })
            .ok()
    });
    let reason = match text("reason") {
        None => "FieldValueInvalid",
        Some(r) => match RULE_REASONS.iter().find(|x| **x == r) {
            Some(x) => x,
            None => {
                errors.push(Cause {
                    reason: "FieldValueNotSupported",
                    field: field(at, "reason"),
                    message: format!(
                        "Unsupported value: {r:?}: supported values: {}",
                        RULE_REASONS.map(|x| format!("{x:?}")).join(", ")
                    ),
                });
                "FieldValueInvalid"
            }
        },
    };
    let field_path = text("fieldPath").map(str::to_owned);
    if let Some(p) = &field_path
        && relative_path(p).is_none()
    {
        errors.push(Cause {
            reason: "FieldValueInvalid",
            field: field(at, "fieldPath"),
            message: format!(
                "Invalid value: {p:?}: must be a path of fields below the schema node, as .spec.replicas or ['a.b']"
            ),
        });
    }
    let transition = rule.as_ref().is_some_and(|r| r.uses("oldSelf"));
    let optional_old_self = raw.get("optionalOldSelf") == Some(&Value::Bool(true));
    if optional_old_self && !transition {
        errors.push(Cause {
            reason: "FieldValueForbidden",
            field: field(at, "optionalOldSelf"),
            message: "Forbidden: may not be set if the rule does not use oldSelf".into(),
        });
    }
    if errors.len() > before {
        return None;
    }
    Some(Rule {
        rule: rule?,
        message,
        message_expression,
        reason,
        field_path,
        transition,
        optional_old_self,
    })
}

/// A rule's `fieldPath` as field names (`.a.b['c.d']` is a, b, c.d); None if malformed.
fn relative_path(p: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = p;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']")?;
            out.push(r[..end].to_owned());
            rest = &r[end + 2..];
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let name = &r[..end];
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '$')
            {
                return None;
            }
            out.push(name.to_owned());
            rest = &r[end..];
        } else {
            return None;
        }
    }
    (!out.is_empty()).then_some(out)
}

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
            rules: 0,
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
            // Children come after their parent in `nodes`: one pass from the end marks
            // every node with rules at or below it.
            for i in (0..s.nodes.len()).rev() {
                let n = &s.nodes[i];
                let below = !n.rules.is_empty()
                    || n.properties.iter().any(|(_, c)| s.nodes[*c].rules_below)
                    || matches!(n.additional, Additional::Node(c) if s.nodes[c].rules_below)
                    || n.items.is_some_and(|c| s.nodes[c].rules_below);
                s.nodes[i].rules_below = below;
            }
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
            rules: Vec::new(),
            rules_below: false,
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
        let rules = match o.get("x-kubernetes-validations") {
            None | Some(Value::Null) => Vec::new(),
            Some(_) if in_validation => {
                errors.push(Cause {
                    reason: "FieldValueForbidden",
                    field: field(at, "x-kubernetes-validations"),
                    message: "Forbidden: must not be used inside allOf, anyOf, oneOf or not".into(),
                });
                Vec::new()
            }
            Some(Value::Array(list)) => list
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    let at = format!("{}[{i}]", field(at, "x-kubernetes-validations"));
                    compile_rule(r, &at, errors).map(Arc::new)
                })
                .collect(),
            Some(other) => {
                errors.push(Cause {
                    reason: "FieldValueInvalid",
                    field: field(at, "x-kubernetes-validations"),
                    message: format!("Invalid value: {other}: must be a list of rules"),
                });
                Vec::new()
            }
        };
        self.rules += rules.len();
        let node = &mut self.nodes[index];
        node.rules = rules;
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

    /// Every way `obj` breaks the schema, with Kubernetes' field paths and wording. `old`:
    /// the stored object of an update, for transition rules (`oldSelf`).
    pub fn validate(&self, obj: &Value, old: Option<&Value>) -> Vec<Cause> {
        self.validate_tallied(obj, old).0
    }

    /// [`Schema::validate`], with how many rules passed, failed and could not be
    /// evaluated.
    pub fn validate_tallied(&self, obj: &Value, old: Option<&Value>) -> (Vec<Cause>, RuleTally) {
        RULE_TALLY.set(RuleTally::default());
        let out = self.validate_untallied(obj, old);
        (out, RULE_TALLY.take())
    }

    fn validate_untallied(&self, obj: &Value, old: Option<&Value>) -> Vec<Cause> {
        let mut out = Vec::new();
        // The root's envelope (`apiVersion`, `kind`, `metadata`) is the server's; the rest
        // is the schema's.
        if obj.is_object() {
            let old = old.filter(|_| self.rules > 0);
            self.check(0, obj, old, "", &mut out, 0, true);
        }
        out
    }

    /// Evaluates node `n`'s rules on `v` (`old`: its correlated old value).
    fn check_rules(
        &self,
        n: usize,
        v: &Value,
        old: Option<&Value>,
        path: &str,
        out: &mut Vec<Cause>,
    ) {
        let node = &self.nodes[n];
        let shown = match node.ty {
            Ty::Any if node.int_or_string => "",
            Ty::Any => "",
            t => t.name(),
        };
        // Of the metadata of the root and of embedded resources, rules see only the name and
        // generateName (as in Kubernetes).
        let envelope_only = |v: &Value| -> Value {
            let mut t = v.clone();
            let m = &v["metadata"];
            t["metadata"] =
                serde_json::json!({"name": m["name"], "generateName": m["generateName"]});
            t
        };
        let trims = (n == 0 || node.embedded) && v.get("metadata").is_some();
        let (trimmed, trimmed_old) = if trims {
            (Some(envelope_only(v)), old.map(envelope_only))
        } else {
            (None, None)
        };
        let v = trimmed.as_ref().unwrap_or(v);
        let old = trimmed_old.as_ref().or(old);
        // Converted once for all the node's rules (`oldSelf` only if a rule reads it).
        let this = crate::cel::Converted::of(v);
        let old_converted = old
            .filter(|_| {
                node.rules
                    .iter()
                    .any(|r| r.transition && !r.optional_old_self)
            })
            .map(crate::cel::Converted::of);
        for r in &node.rules {
            if r.transition && old.is_none() && !r.optional_old_self {
                continue;
            }
            let old_binding = match (&old_converted, r.optional_old_self) {
                (_, true) => crate::cel::Binding::Optional(old),
                (Some(c), false) => crate::cel::Binding::Converted(c),
                (None, false) => crate::cel::Binding::Json(&Value::Null),
            };
            let bindings = [
                ("self", crate::cel::Binding::Converted(&this)),
                ("oldSelf", old_binding),
            ];
            let at = match &r.field_path {
                Some(p) => {
                    let p = relative_path(p).unwrap_or_default().join(".");
                    field(path, &p)
                }
                None => path.to_owned(),
            };
            let result = r.rule.eval_bool(&bindings);
            RULE_TALLY.set({
                let mut t = RULE_TALLY.get();
                match &result {
                    Ok(true) => t.passed += 1,
                    Ok(false) => t.failed += 1,
                    Err(_) => t.errors += 1,
                }
                t
            });
            let message = match result {
                Ok(true) => continue,
                Ok(false) => r
                    .message_expression
                    .as_ref()
                    .and_then(|m| m.eval_string(&bindings).ok())
                    .filter(|m| !m.trim().is_empty() && !m.contains('\n'))
                    .or_else(|| r.message.clone())
                    .unwrap_or_else(|| format!("failed rule: {}", r.rule.source().trim())),
                Err(e) => {
                    out.push(Cause {
                        reason: "FieldValueInvalid",
                        field: at,
                        message: format!(
                            "Invalid value: {shown:?}: {e} evaluating rule: {}",
                            r.rule.source().trim()
                        ),
                    });
                    continue;
                }
            };
            let message = match r.reason {
                "FieldValueForbidden" => format!("Forbidden: {message}"),
                "FieldValueRequired" => format!("Required value: {message}"),
                "FieldValueDuplicate" => format!("Duplicate value: {message}"),
                _ => format!("Invalid value: {shown:?}: {message}"),
            };
            out.push(Cause {
                reason: r.reason,
                field: at,
                message,
            });
        }
    }

    /// Checks `v` against node `n`; `envelope`: `v` is the root object, whose `apiVersion`,
    /// `kind` and `metadata` are not the schema's.
    #[allow(clippy::too_many_arguments)]
    fn check(
        &self,
        n: usize,
        v: &Value,
        old: Option<&Value>,
        path: &str,
        out: &mut Vec<Cause>,
        depth: usize,
        envelope: bool,
    ) {
        if depth > MAX_DEPTH {
            return;
        }
        let node = &self.nodes[n];
        // The old value is carried down only where a rule may read it.
        let old = old.filter(|_| node.rules_below);
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
                    // Items of a map list correlate with the old item of the same keys; of
                    // other lists, with none (as in Kubernetes).
                    let old_items = match (&node.list_type, old.and_then(Value::as_array)) {
                        (ListType::Map(keys), Some(olds)) if self.nodes[i].rules_below => {
                            let key_of = |item: &Value| -> Vec<Value> {
                                keys.iter().map(|k| item[k.as_str()].clone()).collect()
                            };
                            let by_key: std::collections::HashMap<String, &Value> = olds
                                .iter()
                                .map(|o| (Value::Array(key_of(o)).to_string(), o))
                                .collect();
                            Some((by_key, key_of))
                        }
                        _ => None,
                    };
                    for (idx, item) in items.iter().enumerate() {
                        let old_item = old_items.as_ref().and_then(|(by_key, key_of)| {
                            by_key.get(&Value::Array(key_of(item)).to_string()).copied()
                        });
                        self.check(
                            i,
                            item,
                            old_item,
                            &format!("{path}[{idx}]"),
                            out,
                            depth + 1,
                            false,
                        );
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
                        let old_child = old.and_then(|o| o.get(k));
                        self.check(c, child, old_child, &field(path, k), out, depth + 1, false);
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
            self.check(*a, v, None, path, out, depth + 1, envelope);
        }
        let passes = |s: usize| {
            let mut scratch = Vec::new();
            self.check(s, v, None, path, &mut scratch, depth + 1, envelope);
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
        if !node.rules.is_empty() {
            self.check_rules(n, v, old, path, out);
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
            s.validate(&obj, None)
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
        .expect("CEL rules compile");
        assert_eq!(s.rules, 2);
    }

    fn rules_schema() -> Schema {
        Schema::compile(
            &json!({"type": "object", "properties": {"spec": {"type": "object",
                "x-kubernetes-validations": [
                    {"rule": "self.min <= self.max", "message": "min must not exceed max"},
                    {"rule": "self.replicas >= oldSelf.replicas", "reason": "FieldValueForbidden",
                     "messageExpression": "'replicas may not go down from ' + string(oldSelf.replicas)",
                     "fieldPath": ".replicas"},
                    {"rule": "!oldSelf.hasValue() || oldSelf.value().mode == self.mode",
                     "optionalOldSelf": true, "message": "mode is immutable"}],
                "properties": {
                    "min": {"type": "integer"}, "max": {"type": "integer"},
                    "replicas": {"type": "integer"}, "mode": {"type": "string"},
                    "ports": {"type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object",
                            "x-kubernetes-validations": [{"rule": "self.port == oldSelf.port",
                                "message": "a port's number is immutable"}],
                            "properties": {"name": {"type": "string"},
                                "port": {"type": "integer"}}}},
                    "name": {"type": "string",
                        "x-kubernetes-validations": [{"rule": "self.matches('^[a-z]+$')"}]}}}}}),
            "s",
        )
        .expect("compiles")
    }

    #[test]
    fn rules_refuse_objects_with_their_messages_and_reasons() {
        let s = rules_schema();
        let ok = json!({"spec": {"min": 1, "max": 2, "replicas": 3, "mode": "a", "name": "x"}});
        assert!(s.validate(&ok, None).is_empty());
        let bad = json!({"spec": {"min": 3, "max": 2, "replicas": 3, "mode": "a", "name": "X1"}});
        let causes = s.validate(&bad, None);
        let shown: Vec<_> = causes
            .iter()
            .map(|c| (c.field.as_str(), c.message.as_str()))
            .collect();
        assert_eq!(
            shown,
            vec![
                (
                    "spec.name",
                    "Invalid value: \"string\": failed rule: self.matches('^[a-z]+$')"
                ),
                ("spec", "Invalid value: \"object\": min must not exceed max"),
            ]
        );
        // A missing field is an evaluation error, reported with the rule.
        let causes = s.validate(
            &json!({"spec": {"max": 2, "replicas": 1, "mode": "a"}}),
            None,
        );
        assert!(
            causes[0]
                .message
                .contains("no such key: min evaluating rule: self.min <= self.max"),
            "{causes:?}"
        );
    }

    #[test]
    fn transition_rules_see_the_correlated_old_value() {
        let s = rules_schema();
        let old = json!({"spec": {"min": 1, "max": 2, "replicas": 3, "mode": "a",
            "ports": [{"name": "web", "port": 80}, {"name": "db", "port": 5432}]}});
        // Down from 3 to 2, mode changed, a port renumbered: three causes.
        let new = json!({"spec": {"min": 1, "max": 2, "replicas": 2, "mode": "b",
            "ports": [{"name": "db", "port": 5433}, {"name": "web", "port": 80},
                      {"name": "new", "port": 1}]}});
        let causes = s.validate(&new, Some(&old));
        let shown: Vec<_> = causes
            .iter()
            .map(|c| (c.reason, c.field.as_str(), c.message.as_str()))
            .collect();
        assert_eq!(
            shown,
            vec![
                (
                    "FieldValueInvalid",
                    "spec.ports[0]",
                    "Invalid value: \"object\": a port's number is immutable"
                ),
                (
                    "FieldValueForbidden",
                    "spec.replicas",
                    "Forbidden: replicas may not go down from 3"
                ),
                (
                    "FieldValueInvalid",
                    "spec",
                    "Invalid value: \"object\": mode is immutable"
                ),
            ]
        );
        // On create, transition rules are skipped; optionalOldSelf ones run with none.
        assert!(s.validate(&new, None).is_empty());
    }

    #[test]
    fn broken_rules_refuse_the_definition_naming_the_field() {
        let compile = |rules: Value| {
            Schema::compile(
                &json!({"type": "object", "properties": {"a": {"type": "integer",
                    "x-kubernetes-validations": rules}}}),
                "s",
            )
            .expect_err("refused")
        };
        let e = compile(json!([{"rule": "self >"}]));
        assert_eq!(
            e[0].field,
            "s.properties[a].x-kubernetes-validations[0].rule"
        );
        assert!(
            e[0].message.contains("compilation failed"),
            "{}",
            e[0].message
        );
        let e = compile(json!([{"rule": "self > other"}]));
        assert!(
            e[0].message.contains("undeclared reference to 'other'"),
            "{}",
            e[0].message
        );
        let e = compile(json!([{"message": "m"}]));
        assert_eq!(e[0].reason, "FieldValueRequired");
        let e = compile(json!([{"rule": "self > 0", "reason": "Nope"}]));
        assert_eq!(
            e[0].field,
            "s.properties[a].x-kubernetes-validations[0].reason"
        );
        let e = compile(json!([{"rule": "self > 0", "optionalOldSelf": true}]));
        assert_eq!(
            e[0].field,
            "s.properties[a].x-kubernetes-validations[0].optionalOldSelf"
        );
        let e = compile(json!([{"rule": "self > 0", "fieldPath": "a..b"}]));
        assert_eq!(
            e[0].field,
            "s.properties[a].x-kubernetes-validations[0].fieldPath"
        );
        let e = Schema::compile(
            &json!({"type": "object", "properties": {"a": {"type": "integer",
                "anyOf": [{"x-kubernetes-validations": [{"rule": "self > 0"}]}]}}}),
            "s",
        )
        .expect_err("refused");
        assert_eq!(
            e[0].field,
            "s.properties[a].anyOf[0].x-kubernetes-validations"
        );
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
        assert!(s.validate(&json!({"a": 11, "b": "y"}), None).is_empty());
        assert_eq!(s.validate(&json!({"a": 5, "b": "x"}), None).len(), 2);
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
                    for cause in s.validate(&obj, None) {
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
