//! Field ownership (`metadata.managedFields`) and server-side apply.
//!
//! Every write records which manager set which fields, in Kubernetes' `FieldsV1` format
//! (`{"f:spec": {"f:replicas": {}}}`, list items by key as `k:{"name":"app"}`, set members as
//! `v:"x"`). Server-side apply (`application/apply-patch+yaml`) uses it: an applier owns the
//! fields of its configuration; setting a field another manager owns to a different value is
//! a conflict (reported per field) unless `force=true` takes it over; fields the applier owned
//! before and no longer sets are removed if nobody else owns them.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::api::{Api, ApiResponse, api_version, now_secs, rfc3339};
use crate::auth::User;
use crate::catalog::Resource;
use crate::request::{ApiRequest, Verb};
use crate::status::{ApiError, Cause};

/// One step of a field path: `f:name`, `k:{"name":"x"}`, `v:"x"` or `i:3`.
type Path = Vec<String>;

/// Fields that nobody owns: the server sets them.
const SERVER_FIELDS: &[&str] = &[
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

/// The merge key of a list named `field` whose items all carry it (the strategic-merge
/// table's keys for that name); `None` for atomic lists.
fn list_key(field: &str, items: &[Value]) -> Option<&'static str> {
    crate::patch::merge_keys_by_name(field)
        .into_iter()
        .find(|k| items.iter().all(|i| i.get(*k).is_some()))
}

fn is_set_list(field: &str) -> bool {
    crate::patch::is_set_by_name(field)
}

fn item_step(key: &str, item: &Value) -> String {
    let mut m = Map::new();
    m.insert(key.to_owned(), item[key].clone());
    format!("k:{}", Value::Object(m))
}

/// The leaf paths of `v` (and the item paths of keyed lists, as Kubernetes' `.` marker).
fn leaves(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                if path.is_empty() && (k == "apiVersion" || k == "kind") {
                    continue;
                }
                if path.len() == 1
                    && path[0] == "f:metadata"
                    && (SERVER_FIELDS.contains(&k.as_str()) || k == "name" || k == "namespace")
                {
                    continue;
                }
                path.push(format!("f:{k}"));
                match child {
                    Value::Array(items) => {
                        if let Some(key) = list_key(k, items) {
                            for item in items {
                                path.push(item_step(key, item));
                                out.insert(path.clone());
                                leaves(item, path, out);
                                path.pop();
                            }
                        } else if is_set_list(k) {
                            for item in items {
                                path.push(format!("v:{item}"));
                                out.insert(path.clone());
                                path.pop();
                            }
                        } else {
                            out.insert(path.clone());
                        }
                    }
                    _ => leaves(child, path, out),
                }
                path.pop();
            }
        }
        _ => {
            if !path.is_empty() {
                out.insert(path.clone());
            }
        }
    }
}

/// The leaf paths of `new` (as [`leaves`]) into `after`, and into `changed` those whose
/// value differs in `cur` — one walk of both objects, without copying either. The reference
/// that [`changed_leaves`] and [`is_leaf_of`] are tested against.
#[cfg(test)]
fn diff_leaves(
    cur: Option<&Value>,
    new: &Value,
    path: &mut Path,
    after: &mut BTreeSet<Path>,
    changed: &mut BTreeSet<Path>,
) {
    fn leaf(
        path: &Path,
        cur: Option<&Value>,
        new: &Value,
        after: &mut BTreeSet<Path>,
        changed: &mut BTreeSet<Path>,
    ) {
        after.insert(path.clone());
        if cur != Some(new) {
            changed.insert(path.clone());
        }
    }
    match new {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                if path.is_empty() && (k == "apiVersion" || k == "kind") {
                    continue;
                }
                if path.len() == 1
                    && path[0] == "f:metadata"
                    && (SERVER_FIELDS.contains(&k.as_str()) || k == "name" || k == "namespace")
                {
                    continue;
                }
                let cur_child = cur.and_then(|c| c.get(k));
                path.push(format!("f:{k}"));
                match child {
                    Value::Array(items) => {
                        let cur_items = cur_child.and_then(Value::as_array);
                        if let Some(key) = list_key(k, items) {
                            for item in items {
                                let cur_item = cur_items
                                    .and_then(|c| c.iter().find(|i| i.get(key) == item.get(key)));
                                path.push(item_step(key, item));
                                leaf(path, cur_item, item, after, changed);
                                diff_leaves(cur_item, item, path, after, changed);
                                path.pop();
                            }
                        } else if is_set_list(k) {
                            for item in items {
                                let cur_item =
                                    cur_items.and_then(|c| c.iter().find(|i| *i == item));
                                path.push(format!("v:{item}"));
                                leaf(path, cur_item, item, after, changed);
                                path.pop();
                            }
                        } else {
                            leaf(path, cur_child, child, after, changed);
                        }
                    }
                    _ => diff_leaves(cur_child, child, path, after, changed),
                }
                path.pop();
            }
        }
        _ => {
            if !path.is_empty() {
                leaf(path, cur, new, after, changed);
            }
        }
    }
}

/// Into `changed`, the leaf paths of `new` (as [`leaves`]) whose value differs in `cur`. A
/// subtree equal in both is not walked: an update that changes a pod's status walks the
/// status, not the whole pod, and allocates a path only per changed leaf.
fn changed_leaves(cur: Option<&Value>, new: &Value, path: &mut Path, changed: &mut BTreeSet<Path>) {
    if cur == Some(new) {
        return;
    }
    match new {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                if path.is_empty() && (k == "apiVersion" || k == "kind") {
                    continue;
                }
                if path.len() == 1
                    && path[0] == "f:metadata"
                    && (SERVER_FIELDS.contains(&k.as_str()) || k == "name" || k == "namespace")
                {
                    continue;
                }
                let cur_child = cur.and_then(|c| c.get(k));
                if cur_child == Some(child) {
                    continue;
                }
                path.push(format!("f:{k}"));
                match child {
                    Value::Array(items) => {
                        let cur_items = cur_child.and_then(Value::as_array);
                        if let Some(key) = list_key(k, items) {
                            for item in items {
                                let cur_item = cur_items
                                    .and_then(|c| c.iter().find(|i| i.get(key) == item.get(key)));
                                if cur_item != Some(item) {
                                    path.push(item_step(key, item));
                                    changed.insert(path.clone());
                                    changed_leaves(cur_item, item, path, changed);
                                    path.pop();
                                }
                            }
                        } else if is_set_list(k) {
                            for item in items {
                                if !cur_items.is_some_and(|c| c.contains(item)) {
                                    path.push(format!("v:{item}"));
                                    changed.insert(path.clone());
                                    path.pop();
                                }
                            }
                        } else {
                            changed.insert(path.clone());
                        }
                    }
                    _ => changed_leaves(cur_child, child, path, changed),
                }
                path.pop();
            }
        }
        _ => {
            if !path.is_empty() {
                changed.insert(path.clone());
            }
        }
    }
}

/// True if `path` is one of the leaf paths of `obj` (as [`leaves`] lists them): found there,
/// and a leaf — a list item, a set element, or a field whose value is neither a non-empty
/// object nor a keyed or set list.
fn is_leaf_of(obj: &Value, path: &[String]) -> bool {
    let Some(last) = path.last() else {
        return false;
    };
    if path.len() == 1 && (last == "f:apiVersion" || last == "f:kind") {
        return false;
    }
    if path.len() == 2
        && path[0] == "f:metadata"
        && last
            .strip_prefix("f:")
            .is_some_and(|k| SERVER_FIELDS.contains(&k) || k == "name" || k == "namespace")
    {
        return false;
    }
    let Some(v) = value_at(obj, path) else {
        return false;
    };
    if last.starts_with("k:") || last.starts_with("v:") {
        return true;
    }
    let field = last.strip_prefix("f:").unwrap_or(last);
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(items) => list_key(field, items).is_none() && !is_set_list(field),
        _ => true,
    }
}

fn field_set(v: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    leaves(v, &mut Vec::new(), &mut out);
    out
}

/// The value at `path` in `v`.
fn value_at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = v;
    for step in path {
        if let Some(f) = step.strip_prefix("f:") {
            cur = cur.get(f)?;
        } else if let Some(k) = step.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(k).ok()?;
            cur = cur
                .as_array()?
                .iter()
                .find(|item| key.iter().all(|(kk, kv)| item.get(kk) == Some(kv)))?;
        } else if let Some(x) = step.strip_prefix("v:") {
            let want: Value = serde_json::from_str(x).ok()?;
            cur = cur.as_array()?.iter().find(|i| **i == want)?;
        } else {
            return None;
        }
    }
    Some(cur)
}

/// Removes the field at `path` from `v`.
fn remove_at(v: &mut Value, path: &[String]) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for step in parent_path {
        let next = if let Some(f) = step.strip_prefix("f:") {
            cur.get_mut(f)
        } else if let Some(k) = step.strip_prefix("k:") {
            let Ok(key) = serde_json::from_str::<Map<String, Value>>(k) else {
                return;
            };
            cur.as_array_mut().and_then(|a| {
                a.iter_mut()
                    .find(|item| key.iter().all(|(kk, kv)| item.get(kk) == Some(kv)))
            })
        } else {
            None
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(k) = last.strip_prefix("k:") {
        if let (Ok(key), Some(a)) = (
            serde_json::from_str::<Map<String, Value>>(k),
            cur.as_array_mut(),
        ) {
            a.retain(|item| !key.iter().all(|(kk, kv)| item.get(kk) == Some(kv)));
        }
    } else if let Some(x) = last.strip_prefix("v:")
        && let (Ok(want), Some(a)) = (serde_json::from_str::<Value>(x), cur.as_array_mut())
    {
        a.retain(|i| *i != want);
    }
}

/// Nested `FieldsV1` JSON from paths.
fn to_fields_v1(paths: &BTreeSet<Path>) -> Value {
    fn insert(m: &mut Map<String, Value>, path: &[String]) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let entry = m
            .entry(first.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(child) = entry {
            if rest.is_empty() && first.starts_with("k:") {
                child.insert(".".into(), json!({}));
            }
            insert(child, rest);
        }
    }
    let mut root = Map::new();
    for p in paths {
        insert(&mut root, p);
    }
    Value::Object(root)
}

fn from_fields_v1(v: &Value) -> BTreeSet<Path> {
    fn walk(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
        let Some(m) = v.as_object() else { return };
        let children: Vec<_> = m.iter().filter(|(k, _)| *k != ".").collect();
        if (children.is_empty() || m.contains_key(".")) && !path.is_empty() {
            out.insert(path.clone());
        }
        for (k, child) in children {
            path.push(k.clone());
            walk(child, path, out);
            path.pop();
        }
    }
    let mut out = BTreeSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// A managedFields entry.
#[derive(Clone, Debug)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    subresource: Option<String>,
    time: Value,
    fields: BTreeSet<Path>,
}

fn entries(obj: &Value) -> Vec<Entry> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(entry)
        .collect()
}

fn entry(e: &Value) -> Entry {
    Entry {
        manager: e["manager"].as_str().unwrap_or_default().to_owned(),
        operation: e["operation"].as_str().unwrap_or("Update").to_owned(),
        api_version: e["apiVersion"].as_str().unwrap_or_default().to_owned(),
        subresource: e["subresource"].as_str().map(str::to_owned),
        time: e["time"].clone(),
        fields: from_fields_v1(&e["fieldsV1"]),
    }
}

/// An entry as stored (`None` if it owns nothing: it is dropped).
fn entry_json(e: Entry) -> Option<Value> {
    if e.fields.is_empty() {
        return None;
    }
    let mut v = json!({
        "manager": e.manager,
        "operation": e.operation,
        "apiVersion": e.api_version,
        "fieldsType": "FieldsV1",
    });
    // Values are moved in: `json!` would serialize each into a copy.
    v["time"] = e.time;
    v["fieldsV1"] = to_fields_v1(&e.fields);
    if let Some(s) = e.subresource {
        v["subresource"] = json!(s);
    }
    Some(v)
}

/// Stores the entries in `obj.metadata.managedFields` (nothing if metadata is not an object:
/// decoding then refuses the object with a clear error).
fn store_entries(obj: &mut Value, list: Vec<Entry>) {
    store_values(obj, list.into_iter().filter_map(entry_json).collect());
}

/// Stores entries already in their stored form.
fn store_values(obj: &mut Value, out: Vec<Value>) {
    if !(obj["metadata"].is_object() || obj["metadata"].is_null()) {
        return;
    }
    if out.is_empty() {
        if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove("managedFields");
        }
    } else {
        obj["metadata"]["managedFields"] = Value::Array(out);
    }
}

/// The top-level fields whose values differ between `cur` and `new`.
fn differing_fields<'a>(cur: &'a Value, new: &'a Value) -> Vec<&'a str> {
    let (Some(c), Some(n)) = (cur.as_object(), new.as_object()) else {
        return Vec::new();
    };
    c.keys()
        .chain(n.keys().filter(|k| !c.contains_key(*k)))
        .filter(|k| c.get(*k) != n.get(*k))
        .map(String::as_str)
        .collect()
}

fn without_managed(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    v
}

/// Records a non-apply write by `manager`: the fields it changed become its own (taken from
/// whoever owned them); fields that disappeared are nobody's.
pub fn record_update(
    next: &mut Value,
    current: Option<&Value>,
    manager: &str,
    api_version: &str,
    operation: &str,
) {
    record_update_of(next, current, manager, api_version, operation, None);
}

/// [`record_update`] of a write through `subresource` (`status`, `scale`): its fields go to
/// the manager's entry for that subresource, as Kubernetes keys entries by manager,
/// operation and subresource (a controller's spec writes and its status writes are two
/// entries).
pub fn record_update_of(
    next: &mut Value,
    current: Option<&Value>,
    manager: &str,
    api_version: &str,
    operation: &str,
    subresource: Option<&str>,
) {
    if current.is_none() && !next["metadata"]["managedFields"].is_array() {
        // A new object sent without managedFields: every field is this manager's.
        record_create(next, manager, api_version, operation);
        return;
    }
    let mut changed = BTreeSet::new();
    changed_leaves(current, next, &mut Vec::new(), &mut changed);
    // Stored entries (not a client's own list) that own nothing in a top-level field this
    // write changed are kept as stored, without decoding their field sets: none of their
    // fields changed or disappeared (Kubernetes, too, takes from other managers only the
    // fields in the write's diff).
    let sent = next["metadata"]["managedFields"].is_array();
    let differing: Option<Vec<String>> = match current {
        Some(c) if !sent || c["metadata"]["managedFields"] == next["metadata"]["managedFields"] => {
            Some(
                differing_fields(c, next)
                    .into_iter()
                    .map(|k| format!("f:{k}"))
                    .collect(),
            )
        }
        _ => None,
    };
    // Entries come from the object the client sent (taken: they are stored again below),
    // or the stored one if it sent none.
    let raw: Vec<Value> = if sent {
        match next["metadata"]["managedFields"].take() {
            Value::Array(entries) => entries,
            _ => Vec::new(),
        }
    } else {
        current
            .and_then(|c| c["metadata"]["managedFields"].as_array().cloned())
            .unwrap_or_default()
    };
    let own = |e: &Value| {
        e["manager"] == manager
            && e["operation"].as_str().unwrap_or("Update") == operation
            && e["subresource"].as_str() == subresource
    };
    let untouched = |e: &Value| {
        let Some(differing) = &differing else {
            return false;
        };
        let Some(fields) = e["fieldsV1"].as_object().filter(|f| !f.is_empty()) else {
            return false;
        };
        (!own(e) || changed.is_empty()) && !differing.iter().any(|k| fields.contains_key(k))
    };
    enum Slot {
        Kept(Value),
        Decoded(Entry),
    }
    let mut list: Vec<Slot> = raw
        .into_iter()
        .map(|e| {
            if untouched(&e) {
                Slot::Kept(e)
            } else {
                Slot::Decoded(entry(&e))
            }
        })
        .collect();
    // A manager keeps the fields that are still there and that this write did not change.
    for slot in &mut list {
        if let Slot::Decoded(e) = slot {
            e.fields
                .retain(|p| !changed.contains(p) && is_leaf_of(next, p));
        }
    }
    if !changed.is_empty() {
        let mine = list.iter_mut().find_map(|slot| match slot {
            Slot::Decoded(e)
                if e.manager == manager
                    && e.operation == operation
                    && e.subresource.as_deref() == subresource =>
            {
                Some(e)
            }
            _ => None,
        });
        match mine {
            Some(e) => {
                e.fields.extend(changed);
                e.time = json!(rfc3339(now_secs()));
            }
            None => list.push(Slot::Decoded(Entry {
                manager: manager.to_owned(),
                operation: operation.to_owned(),
                api_version: api_version.to_owned(),
                subresource: subresource.map(str::to_owned),
                time: json!(rfc3339(now_secs())),
                fields: changed,
            })),
        }
    }
    let out = list
        .into_iter()
        .filter_map(|slot| match slot {
            Slot::Kept(v) => Some(v),
            Slot::Decoded(e) => entry_json(e),
        })
        .collect();
    store_values(next, out);
}

/// [`record_update`] of a new object sent without managedFields: one entry owning every
/// leaf of it. Its `FieldsV1` is built in one walk of the object, the tree
/// `to_fields_v1(leaves(obj))` gives, without listing the paths first.
fn record_create(next: &mut Value, manager: &str, api_version: &str, operation: &str) {
    #[derive(Clone, Copy, PartialEq)]
    enum At {
        Root,
        Metadata,
        Inside,
    }
    fn walk(m: &Map<String, Value>, at: At, out: &mut Map<String, Value>) {
        for (k, child) in m {
            let skipped = match at {
                At::Root => k == "apiVersion" || k == "kind",
                At::Metadata => {
                    SERVER_FIELDS.contains(&k.as_str()) || k == "name" || k == "namespace"
                }
                At::Inside => false,
            };
            if skipped {
                continue;
            }
            let node = match child {
                Value::Array(items) => {
                    if let Some(key) = list_key(k, items) {
                        let mut n = Map::new();
                        for item in items {
                            let slot = n
                                .entry(item_step(key, item))
                                .or_insert_with(|| Value::Object(Map::new()));
                            if let Value::Object(slot) = slot {
                                slot.insert(".".into(), Value::Object(Map::new()));
                                if let Value::Object(fields) = item {
                                    walk(fields, At::Inside, slot);
                                }
                            }
                        }
                        n
                    } else if is_set_list(k) {
                        items
                            .iter()
                            .map(|i| (format!("v:{i}"), Value::Object(Map::new())))
                            .collect()
                    } else {
                        // An atomic list is one leaf.
                        out.insert(format!("f:{k}"), Value::Object(Map::new()));
                        continue;
                    }
                }
                Value::Object(fields) if !fields.is_empty() => {
                    let mut n = Map::new();
                    let inner = if at == At::Root && k == "metadata" {
                        At::Metadata
                    } else {
                        At::Inside
                    };
                    walk(fields, inner, &mut n);
                    n
                }
                // A scalar, null or empty object is one leaf.
                _ => {
                    out.insert(format!("f:{k}"), Value::Object(Map::new()));
                    continue;
                }
            };
            // A subtree with no leaf (an empty keyed or set list, server fields only) is
            // not listed, as `leaves` lists no path for it.
            if !node.is_empty() {
                out.insert(format!("f:{k}"), Value::Object(node));
            }
        }
    }
    if !(next["metadata"].is_object() || next["metadata"].is_null()) {
        return;
    }
    let mut fields = Map::new();
    if let Value::Object(m) = &*next {
        walk(m, At::Root, &mut fields);
    }
    if fields.is_empty() {
        if let Some(m) = next["metadata"].as_object_mut() {
            m.remove("managedFields");
        }
        return;
    }
    let mut entry = json!({
        "manager": manager,
        "operation": operation,
        "apiVersion": api_version,
        "time": rfc3339(now_secs()),
        "fieldsType": "FieldsV1",
    });
    // Moved in, not through `json!`: the macro would serialize the set into a copy.
    entry["fieldsV1"] = Value::Object(fields);
    next["metadata"]["managedFields"] = Value::Array(vec![entry]);
}

fn path_string(p: &Path) -> String {
    p.iter()
        .map(|s| {
            if let Some(f) = s.strip_prefix("f:") {
                format!(".{f}")
            } else if let Some(k) = s.strip_prefix("k:") {
                format!("[{k}]")
            } else if let Some(v) = s.strip_prefix("v:") {
                format!("[={v}]")
            } else {
                s.clone()
            }
        })
        .collect()
}

/// Server-side apply of `req.body` by `req.params.field_manager`.
pub async fn apply(api: &Api, req: &ApiRequest, user: &User) -> Result<ApiResponse, ApiError> {
    let res: &'static Resource = req.resource;
    let manager = req.params.field_manager.clone().ok_or_else(|| {
        ApiError::bad_request(
            "fieldManager is required for apply requests: pass ?fieldManager=<your tool's name> (kubectl sends it)",
        )
    })?;
    let config: Value = serde_json::from_slice(&req.body).map_err(|e| {
        ApiError::bad_request(format!(
            "the apply configuration must be JSON (YAML is accepted only in its JSON form): {e}"
        ))
    })?;
    if !config.is_object() || !(config["metadata"].is_object() || config["metadata"].is_null()) {
        return Err(ApiError::bad_request(
            "the apply configuration must be an object whose metadata is an object",
        ));
    }
    let name = req.name.clone().unwrap_or_default();
    if let Some(n) = config["metadata"]["name"].as_str()
        && n != name
    {
        return Err(ApiError::bad_request(format!(
            "the name in the apply configuration ({n}) does not match the name on the URL ({name})"
        )));
    }
    let exists = api
        .store()
        .get(crate::api::object_key(res, req.namespace.as_deref(), &name).as_bytes())
        .await
        .map_err(crate::api::store_error)?
        .is_some();
    let config_fields: BTreeSet<Path> = field_set(&without_managed(&config));
    let force = req.params.force;
    let version = api_version(res);
    if !exists {
        // Apply creates what does not exist, in one write, owned by the applier.
        let mut create = req.clone();
        create.verb = Verb::Create;
        create.name = None;
        let mut obj = without_managed(&config);
        obj["metadata"]["name"] = json!(name);
        let mut owned = json!({"metadata": {}});
        store_entries(
            &mut owned,
            vec![Entry {
                manager: manager.clone(),
                operation: "Apply".into(),
                api_version: version.clone(),
                subresource: None,
                time: json!(rfc3339(now_secs())),
                fields: config_fields.clone(),
            }],
        );
        let managed = owned["metadata"]["managedFields"].take();
        match Box::pin(api.create_applied(&create, user, obj, managed)).await {
            // Another request created it since it was looked for: apply to what is there,
            // as Kubernetes' apply does, rather than fail a concurrent apply.
            Err(e) if e.code == 409 && e.reason == "AlreadyExists" => {}
            other => return other,
        }
    }
    let conflicts = std::sync::Mutex::new(Vec::<Cause>::new());
    let result = api
        .write_existing(
            req,
            user,
            |current| {
                let mut list = entries(&current);
                let mut found = Vec::new();
                for e in &mut list {
                    if e.manager == manager && e.operation == "Apply" {
                        continue;
                    }
                    let clash: Vec<Path> = e
                        .fields
                        .iter()
                        .filter(|p| {
                            config_fields.contains(*p)
                                && value_at(&config, p).is_some_and(|v| {
                                    !v.is_object() && value_at(&current, p) != Some(v)
                                })
                        })
                        .cloned()
                        .collect();
                    if force {
                        e.fields.retain(|p| !clash.contains(p));
                    } else {
                        for p in clash {
                            found.push(Cause {
                                reason: "FieldManagerConflict",
                                field: path_string(&p),
                                message: format!(
                                    "conflict with \"{}\"{}",
                                    e.manager,
                                    if e.operation == "Update" {
                                        format!(" using {}", e.api_version)
                                    } else {
                                        String::new()
                                    }
                                ),
                            });
                        }
                    }
                }
                if !found.is_empty() {
                    if let Ok(mut c) = conflicts.lock() {
                        *c = found;
                    }
                    return Err(ApiError::new(409, "Conflict", "apply conflict"));
                }
                let mut next = without_managed(&current);
                // Fields this manager applied before and no longer sets, if nobody else
                // owns them, go.
                let previously: BTreeSet<Path> = list
                    .iter()
                    .filter(|e| e.manager == manager && e.operation == "Apply")
                    .flat_map(|e| e.fields.iter().cloned())
                    .collect();
                let others: BTreeSet<Path> = list
                    .iter()
                    .filter(|e| !(e.manager == manager && e.operation == "Apply"))
                    .flat_map(|e| e.fields.iter().cloned())
                    .collect();
                for p in previously.difference(&config_fields) {
                    if !others.contains(p) {
                        remove_at(&mut next, p);
                    }
                }
                let schema = crate::kinds::of(res);
                let patch = serde_json::to_vec(&without_managed(&config))
                    .map_err(|e| ApiError::internal(e.to_string()))?;
                crate::patch::strategic_merge(&mut next, &patch, &(schema.schema_name)())
                    .map_err(|e| ApiError::bad_request(e.0))?;
                // Ownership: the config's fields are the applier's, and nobody else's when
                // forced.
                list.retain(|e| !(e.manager == manager && e.operation == "Apply"));
                for e in &mut list {
                    if force {
                        e.fields.retain(|p| !config_fields.contains(p));
                    }
                }
                list.push(Entry {
                    manager: manager.clone(),
                    operation: "Apply".into(),
                    api_version: version.clone(),
                    subresource: None,
                    time: json!(rfc3339(now_secs())),
                    fields: config_fields.clone(),
                });
                store_entries(&mut next, list);
                if let Some(meta) = next["metadata"].as_object_mut() {
                    meta.insert(
                        "resourceVersion".into(),
                        current["metadata"]["resourceVersion"].clone(),
                    );
                }
                Ok(next)
            },
            Vec::new(),
        )
        .await;
    match result {
        Err(e) if e.message == "apply conflict" => {
            let causes = conflicts.lock().map(|c| c.clone()).unwrap_or_default();
            let list: Vec<String> = causes
                .iter()
                .map(|c| format!("{}: {}", c.message, c.field))
                .collect();
            let mut err = ApiError::new(
                409,
                "Conflict",
                format!(
                    "Apply failed with {} conflict{}: {}",
                    causes.len(),
                    if causes.len() == 1 { "" } else { "s" },
                    list.join("\n")
                ),
            );
            err.details = Some(json!({
                "name": name,
                "group": res.group,
                "kind": res.plural,
                "causes": causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect::<Vec<_>>(),
            }));
            Err(err)
        }
        other => other,
    }
}

/// Field paths of an object as `.spec.replicas` strings (for tests and messages).
pub fn owned_by(obj: &Value, manager: &str) -> Vec<String> {
    let mut out: BTreeMap<String, ()> = BTreeMap::new();
    for e in entries(obj) {
        if e.manager == manager {
            for p in &e.fields {
                out.insert(path_string(p), ());
            }
        }
    }
    out.into_keys().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// [`record_update`] as it was before the pruned walk: every leaf of the new object
    /// listed, entries kept where listed and unchanged.
    fn record_update_reference(next: &mut Value, current: Option<&Value>, manager: &str) {
        let mut after = BTreeSet::new();
        let mut changed = BTreeSet::new();
        diff_leaves(current, next, &mut Vec::new(), &mut after, &mut changed);
        let mut list = if next["metadata"]["managedFields"].is_array() {
            entries(next)
        } else {
            current.map(entries).unwrap_or_default()
        };
        for e in &mut list {
            e.fields
                .retain(|p| after.contains(p) && !changed.contains(p));
        }
        if !changed.is_empty() {
            match list
                .iter_mut()
                .find(|e| e.manager == manager && e.operation == "Update")
            {
                Some(e) => e.fields.extend(changed),
                None => list.push(Entry {
                    manager: manager.to_owned(),
                    operation: "Update".to_owned(),
                    api_version: "v1".to_owned(),
                    subresource: None,
                    time: json!(rfc3339(now_secs())),
                    fields: changed,
                }),
            }
        }
        store_entries(next, list);
    }

    fn without_times(mut v: Value) -> Value {
        for e in v["metadata"]["managedFields"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            e["time"] = Value::Null;
        }
        v
    }

    /// A pod-like object from a few choices: labels, finalizers (a set list), containers (a
    /// list keyed by name), an empty object, node name and status.
    fn object() -> impl Strategy<Value = Value> {
        (
            proptest::collection::btree_map("[abc]", "[12]", 0..3),
            proptest::collection::btree_set("[xy]", 0..3),
            proptest::collection::btree_map(
                "c[123]",
                ("i[12]", proptest::option::of(80u16..82)),
                0..3,
            ),
            any::<bool>(),
            proptest::option::of("n[12]"),
            proptest::option::of(("Pending|Running", any::<bool>())),
        )
            .prop_map(|(labels, finalizers, containers, empty, node, status)| {
                let containers: Vec<Value> = containers
                    .into_iter()
                    .map(|(name, (image, port))| {
                        let mut c = json!({"name": name, "image": image});
                        if let Some(p) = port {
                            c["ports"] = json!([{"containerPort": p}]);
                        }
                        c
                    })
                    .collect();
                let mut o = json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "p", "namespace": "ns", "labels": labels,
                        "finalizers": finalizers},
                    "spec": {"containers": containers}});
                if empty {
                    o["spec"]["securityContext"] = json!({});
                }
                if let Some(n) = node {
                    o["spec"]["nodeName"] = json!(n);
                }
                if let Some((phase, ready)) = status {
                    o["status"] = json!({"phase": phase,
                        "conditions": [{"type": "Ready", "status": ready.to_string()}]});
                }
                o
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// The pruned walk records exactly what the full walk did: the same managers own the
        /// same fields after any update from any state.
        #[test]
        fn pruned_update_records_the_same_managed_fields(
            first in object(), second in object(), third in object()
        ) {
            let mut current = first;
            record_update(&mut current, None, "a", "v1", "Update");
            let mut older = second.clone();
            record_update(&mut older, Some(&current), "b", "v1", "Update");
            let (mut fast, mut slow) = (third.clone(), third);
            record_update(&mut fast, Some(&older), "a", "v1", "Update");
            record_update_reference(&mut slow, Some(&older), "a");
            prop_assert_eq!(without_times(fast), without_times(slow));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Status-only writes (as kubelets and agents make them, with the stored
        /// managedFields carried over) keep the entries they leave alone as stored, and
        /// record exactly what the full walk did.
        #[test]
        fn status_writes_record_the_same_managed_fields(
            first in object(), second in object(), third in object(), by_a in any::<bool>()
        ) {
            let mut current = first;
            record_update(&mut current, None, "a", "v1", "Update");
            let mut older = current.clone();
            older["status"] = second["status"].clone();
            record_update(&mut older, Some(&current), "b", "v1", "Update");
            let mut next = older.clone();
            next["status"] = third["status"].clone();
            if next["status"].is_null() {
                next.as_object_mut().expect("object").remove("status");
            }
            let who = if by_a { "a" } else { "b" };
            let (mut fast, mut slow) = (next.clone(), next);
            record_update(&mut fast, Some(&older), who, "v1", "Update");
            record_update_reference(&mut slow, Some(&older), who);
            prop_assert_eq!(without_times(fast), without_times(slow));
        }

        /// A new object's managedFields built in one walk equal the ones listed leaf by
        /// leaf, for any shape (empty labels, empty keyed and set lists, empty objects).
        #[test]
        fn a_new_objects_fields_are_the_listed_leaves(obj in object(), plain in any::<bool>()) {
            let mut obj = obj;
            if plain {
                obj["metadata"] = json!({"name": "p"});
            }
            let (mut fast, mut slow) = (obj.clone(), obj);
            record_update(&mut fast, None, "m", "v1", "Update");
            record_update_reference(&mut slow, None, "m");
            prop_assert_eq!(without_times(fast), without_times(slow));
        }
    }

    fn deploy(replicas: i64, image: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "uid": "u", "labels": {"app": "web"}, "finalizers": ["x"]},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "app", "image": image}]}}}})
    }

    #[test]
    fn field_sets_round_trip_through_fields_v1() {
        let set = field_set(&deploy(1, "a"));
        assert!(set.contains(&vec!["f:spec".to_owned(), "f:replicas".to_owned()]));
        assert!(set.contains(&vec![
            "f:metadata".to_owned(),
            "f:finalizers".to_owned(),
            "v:\"x\"".to_owned()
        ]));
        assert!(
            !set.iter()
                .any(|p| p.len() == 2 && p[0] == "f:metadata" && p[1] == "f:uid"),
            "server fields are nobody's"
        );
        let v1 = to_fields_v1(&set);
        assert!(
            v1["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"app\"}"]["."]
                .is_object()
        );
        assert_eq!(from_fields_v1(&v1), set);
    }

    #[test]
    fn updates_move_ownership_of_changed_fields() {
        let mut created = deploy(1, "a");
        record_update(&mut created, None, "creator", "apps/v1", "Update");
        assert!(owned_by(&created, "creator").contains(&".spec.replicas".to_owned()));
        let mut scaled = created.clone();
        scaled["spec"]["replicas"] = json!(5);
        record_update(&mut scaled, Some(&created), "scaler", "apps/v1", "Update");
        assert_eq!(owned_by(&scaled, "scaler"), vec![".spec.replicas"]);
        assert!(!owned_by(&scaled, "creator").contains(&".spec.replicas".to_owned()));
        assert!(
            owned_by(&scaled, "creator")
                .iter()
                .any(|p| p.ends_with(".image"))
        );
    }

    #[test]
    fn paths_find_and_remove_keyed_items() {
        let mut d = deploy(1, "a");
        let p: Path = vec![
            "f:spec".into(),
            "f:template".into(),
            "f:spec".into(),
            "f:containers".into(),
            "k:{\"name\":\"app\"}".into(),
            "f:image".into(),
        ];
        assert_eq!(value_at(&d, &p), Some(&json!("a")));
        assert_eq!(
            path_string(&p),
            ".spec.template.spec.containers[{\"name\":\"app\"}].image"
        );
        remove_at(&mut d, &p);
        assert_eq!(value_at(&d, &p), None);
        remove_at(&mut d, &p[..5]);
        assert_eq!(d["spec"]["template"]["spec"]["containers"], json!([]));
    }
}
