//! Patches: RFC 6902 JSON patch, RFC 7386 merge patch, and Kubernetes' strategic merge patch
//! (what kubectl's client-side `apply`, `label`, `annotate`, `scale` and `edit` send).
//!
//! A strategic merge patch merges lists of objects by a key instead of replacing them
//! (containers by `name`, ports by `containerPort`, ...) and understands the directives
//! kubectl writes: `$patch: replace|delete|merge`, `$retainKeys`, `$setElementOrder/<field>`
//! and `$deleteFromPrimitiveList/<field>`. Which lists merge, and on which key, is a property
//! of the field in its Go type; the table below carries it for the built-in kinds, and the
//! kinds' schemas say which type each field has.

use std::collections::HashMap;
use std::sync::OnceLock;

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value};

use crate::kinds;

/// Why a patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchError(pub String);

/// Applies an RFC 6902 JSON patch.
pub fn json_patch(doc: &mut Value, patch: &[u8]) -> Result<(), PatchError> {
    let p: json_patch::Patch = serde_json::from_slice(patch)
        .map_err(|e| PatchError(format!("the JSON patch is not a list of operations: {e}")))?;
    json_patch::patch(doc, &p).map_err(|e| PatchError(e.to_string()))
}

/// Applies an RFC 7386 merge patch.
pub fn merge_patch(doc: &mut Value, patch: &[u8]) -> Result<(), PatchError> {
    let p: Value = serde_json::from_slice(patch)
        .map_err(|e| PatchError(format!("the merge patch is not JSON: {e}")))?;
    if !p.is_object() {
        return Err(PatchError("a merge patch must be a JSON object".into()));
    }
    json_patch::merge(doc, &p);
    Ok(())
}

/// How a list field merges: on a key for lists of objects, as a set for lists of scalars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListMerge {
    Key(&'static str),
    Set,
}

/// `(type, field)` → merge strategy, from the `patchStrategy`/`patchMergeKey` tags of
/// Kubernetes' API types. Lists not named here are replaced whole (atomic).
const MERGE_LISTS: &[(&str, &str, ListMerge)] = &[
    ("ObjectMeta", "finalizers", ListMerge::Set),
    ("ObjectMeta", "ownerReferences", ListMerge::Key("uid")),
    ("PodSpec", "containers", ListMerge::Key("name")),
    ("PodSpec", "initContainers", ListMerge::Key("name")),
    ("PodSpec", "ephemeralContainers", ListMerge::Key("name")),
    ("PodSpec", "volumes", ListMerge::Key("name")),
    ("PodSpec", "imagePullSecrets", ListMerge::Key("name")),
    ("PodSpec", "hostAliases", ListMerge::Key("ip")),
    (
        "PodSpec",
        "topologySpreadConstraints",
        ListMerge::Key("topologyKey"),
    ),
    ("PodSpec", "resourceClaims", ListMerge::Key("name")),
    ("PodSpec", "schedulingGates", ListMerge::Key("name")),
    ("Container", "ports", ListMerge::Key("containerPort")),
    ("Container", "env", ListMerge::Key("name")),
    ("Container", "volumeMounts", ListMerge::Key("mountPath")),
    ("Container", "volumeDevices", ListMerge::Key("devicePath")),
    (
        "EphemeralContainer",
        "ports",
        ListMerge::Key("containerPort"),
    ),
    ("EphemeralContainer", "env", ListMerge::Key("name")),
    (
        "EphemeralContainer",
        "volumeMounts",
        ListMerge::Key("mountPath"),
    ),
    (
        "EphemeralContainer",
        "volumeDevices",
        ListMerge::Key("devicePath"),
    ),
    ("ServiceSpec", "ports", ListMerge::Key("port")),
    ("PodStatus", "conditions", ListMerge::Key("type")),
    ("NodeStatus", "conditions", ListMerge::Key("type")),
    ("NodeStatus", "addresses", ListMerge::Key("type")),
    ("NamespaceStatus", "conditions", ListMerge::Key("type")),
    ("DeploymentStatus", "conditions", ListMerge::Key("type")),
    ("ReplicaSetStatus", "conditions", ListMerge::Key("type")),
    ("DaemonSetStatus", "conditions", ListMerge::Key("type")),
    ("StatefulSetStatus", "conditions", ListMerge::Key("type")),
    (
        "PodDisruptionBudgetStatus",
        "conditions",
        ListMerge::Key("type"),
    ),
    (
        "HorizontalPodAutoscalerStatus",
        "conditions",
        ListMerge::Key("type"),
    ),
];

/// Marks the merge lists in OpenAPI schemas the way Kubernetes publishes them
/// (`x-kubernetes-patch-strategy`, `x-kubernetes-patch-merge-key`, `x-kubernetes-list-type`):
/// kubectl's client-side `apply` computes its strategic merge patches from them.
pub fn annotate_schemas(schemas: &mut Map<String, Value>) {
    for (name, schema) in schemas.iter_mut() {
        let short = name.rsplit('.').next().unwrap_or(name);
        let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
            continue;
        };
        for (t, field, strategy) in MERGE_LISTS {
            if *t != short {
                continue;
            }
            let Some(p) = props.get_mut(*field).and_then(Value::as_object_mut) else {
                continue;
            };
            let retain = *field == "volumes";
            p.insert(
                "x-kubernetes-patch-strategy".into(),
                Value::from(if retain { "merge,retainKeys" } else { "merge" }),
            );
            match strategy {
                ListMerge::Key(k) => {
                    p.insert("x-kubernetes-patch-merge-key".into(), Value::from(*k));
                    p.insert("x-kubernetes-list-type".into(), Value::from("map"));
                    p.insert("x-kubernetes-list-map-keys".into(), Value::from(vec![*k]));
                }
                ListMerge::Set => {
                    p.insert("x-kubernetes-list-type".into(), Value::from("set"));
                }
            }
        }
        for (t, field) in RETAIN_KEYS {
            if *t == short
                && let Some(p) = props.get_mut(*field).and_then(Value::as_object_mut)
            {
                p.insert(
                    "x-kubernetes-patch-strategy".into(),
                    Value::from("retainKeys"),
                );
            }
        }
    }
}

/// Structs whose union members are cleared together (`$retainKeys`).
const RETAIN_KEYS: &[(&str, &str)] = &[
    ("DeploymentSpec", "strategy"),
    ("DaemonSetSpec", "updateStrategy"),
    ("StatefulSetSpec", "updateStrategy"),
];

/// Merge keys a list named `field` has in any type, in table order (`ports` is merged on
/// `containerPort` in containers and on `port` in services): for walks that do not track
/// types, such as server-side apply's field sets.
pub(crate) fn merge_keys_by_name(field: &str) -> Vec<&'static str> {
    let mut keys = Vec::new();
    for (_, f, m) in MERGE_LISTS {
        if let ListMerge::Key(k) = m
            && *f == field
            && !keys.contains(k)
        {
            keys.push(*k);
        }
    }
    keys
}

/// True if a list named `field` merges as a set of scalars (`finalizers`).
pub(crate) fn is_set_by_name(field: &str) -> bool {
    MERGE_LISTS
        .iter()
        .any(|(_, f, m)| *f == field && *m == ListMerge::Set)
}

fn list_merge(ty: &str, field: &str) -> Option<ListMerge> {
    let short = ty.rsplit('.').next().unwrap_or(ty);
    MERGE_LISTS
        .iter()
        .find(|(t, f, _)| *t == short && *f == field)
        .map(|(_, _, m)| *m)
}

/// The schemas of every served kind and what they refer to, by name, unmodified (`$ref`s
/// point at `#/components/schemas/<name>`).
fn schemas() -> &'static HashMap<String, Value> {
    static SCHEMAS: OnceLock<HashMap<String, Value>> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let mut generator = SchemaSettings::openapi3().into_generator();
        for res in crate::catalog::served() {
            (kinds::of(res).schema)(&mut generator);
        }
        generator.take_definitions(false).into_iter().collect()
    })
}

/// The OpenAPI schema named `name` (`io.k8s.api.core.v1.PodSpec`), if a served kind uses it.
pub(crate) fn schema(name: &str) -> Option<&'static Value> {
    schemas().get(name)
}

fn ref_name(schema: &Value) -> Option<&str> {
    schema
        .get("$ref")
        .or_else(|| schema.get("allOf").and_then(|a| a.get(0)?.get("$ref")))
        .and_then(Value::as_str)
        .and_then(|r| r.rsplit('/').next())
}

/// The type of field `field` of type `ty`: (the field's schema name if it is a struct,
/// the item type's name if it is a list of structs or a map of structs).
fn field_types(ty: Option<&str>, field: &str) -> (Option<String>, Option<String>) {
    let Some(prop) = ty
        .and_then(|t| schemas().get(t))
        .and_then(|s| s.get("properties"))
        .and_then(|p| p.get(field))
    else {
        return (None, None);
    };
    let direct = ref_name(prop).map(str::to_owned);
    let item = prop
        .get("items")
        .or_else(|| prop.get("additionalProperties"))
        .and_then(ref_name)
        .map(str::to_owned);
    (direct, item)
}

/// Applies a strategic merge patch to `doc`, an object whose schema is `ty`
/// (`io.k8s.api.apps.v1.Deployment`).
pub fn strategic_merge(doc: &mut Value, patch: &[u8], ty: &str) -> Result<(), PatchError> {
    let p: Value = serde_json::from_slice(patch)
        .map_err(|e| PatchError(format!("the strategic merge patch is not JSON: {e}")))?;
    if !p.is_object() {
        return Err(PatchError(
            "a strategic merge patch must be a JSON object".into(),
        ));
    }
    merge_object(doc, &p, Some(ty))
}

fn merge_object(doc: &mut Value, patch: &Value, ty: Option<&str>) -> Result<(), PatchError> {
    let Value::Object(pm) = patch else {
        *doc = patch.clone();
        return Ok(());
    };
    match pm.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = pm.clone();
            replaced.remove("$patch");
            *doc = Value::Object(replaced);
            return Ok(());
        }
        Some("delete") => {
            *doc = Value::Null;
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => {
            return Err(PatchError(format!(
                "unknown patch directive $patch: {other:?} (use replace, delete or merge)"
            )));
        }
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Value::Object(dm) = doc else {
        return Ok(());
    };
    if let Some(keep) = pm.get("$retainKeys") {
        let keep: Vec<&str> = keep
            .as_array()
            .ok_or_else(|| PatchError("$retainKeys must be a list of field names".into()))?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        dm.retain(|k, _| keep.contains(&k.as_str()) || pm.contains_key(k));
    }
    for (k, v) in pm {
        if k == "$patch" || k == "$retainKeys" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let remove = v.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(list)) = dm.get_mut(field) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        if k.starts_with("$setElementOrder/") {
            continue;
        }
        if k.starts_with('$') {
            return Err(PatchError(format!("unknown patch directive {k:?}")));
        }
        if v.is_null() {
            dm.remove(k);
            continue;
        }
        let (direct, item) = field_types(ty, k);
        match v {
            Value::Object(_) => {
                let target = dm.entry(k.clone()).or_insert(Value::Null);
                if direct.is_some() {
                    merge_object(target, v, direct.as_deref())?;
                } else {
                    // A map (labels, resources.requests) or a free-form object: merge
                    // key by key; values of struct-typed maps merge strategically.
                    merge_map(target, v, item.as_deref())?;
                }
                if target.is_null() {
                    dm.remove(k);
                }
            }
            Value::Array(items) => {
                let strategy = ty.and_then(|t| list_merge(t, k));
                let target = dm.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                match strategy {
                    Some(ListMerge::Key(key)) => {
                        merge_keyed_list(target, items, key, item.as_deref())?
                    }
                    Some(ListMerge::Set) => {
                        let list = target.as_array_mut().ok_or_else(|| {
                            PatchError(format!("{k} is not a list in the object"))
                        })?;
                        for x in items {
                            if !list.contains(x) {
                                list.push(x.clone());
                            }
                        }
                    }
                    None => *target = v.clone(),
                }
                if let Some(order) = pm.get(&format!("$setElementOrder/{k}")) {
                    reorder(target, order, strategy);
                }
            }
            _ => {
                dm.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(())
}

fn merge_map(doc: &mut Value, patch: &Value, item_ty: Option<&str>) -> Result<(), PatchError> {
    let Value::Object(pm) = patch else {
        *doc = patch.clone();
        return Ok(());
    };
    if pm.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = pm.clone();
        replaced.remove("$patch");
        *doc = Value::Object(replaced);
        return Ok(());
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Value::Object(dm) = doc else {
        return Ok(());
    };
    for (k, v) in pm {
        if v.is_null() {
            dm.remove(k);
        } else if v.is_object() {
            let target = dm.entry(k.clone()).or_insert(Value::Null);
            if item_ty.is_some() {
                merge_object(target, v, item_ty)?;
            } else {
                merge_map(target, v, None)?;
            }
        } else {
            dm.insert(k.clone(), v.clone());
        }
    }
    Ok(())
}

fn merge_keyed_list(
    doc: &mut Value,
    items: &[Value],
    key: &str,
    item_ty: Option<&str>,
) -> Result<(), PatchError> {
    if !doc.is_array() {
        *doc = Value::Array(Vec::new());
    }
    let Value::Array(list) = doc else {
        return Ok(());
    };
    // `$patch: replace` as an item replaces the whole list with the other items.
    if items
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *list = items
            .iter()
            .filter(|i| i.get("$patch").is_none())
            .cloned()
            .collect();
        return Ok(());
    }
    for item in items {
        let Some(k) = item.get(key) else {
            return Err(PatchError(format!(
                "an item of a list merged on {key:?} has no {key:?}: {item}"
            )));
        };
        let pos = list.iter().position(|x| x.get(key) == Some(k));
        if item.get("$patch").and_then(Value::as_str) == Some("delete") {
            list.retain(|x| x.get(key) != Some(k));
            continue;
        }
        match pos {
            Some(i) => merge_object(&mut list[i], item, item_ty)?,
            None => {
                let mut fresh = Value::Object(Map::new());
                merge_object(&mut fresh, item, item_ty)?;
                list.push(fresh);
            }
        }
    }
    Ok(())
}

/// `$setElementOrder`: items named in `order` first, in that order; the rest after.
fn reorder(doc: &mut Value, order: &Value, strategy: Option<ListMerge>) {
    let (Value::Array(list), Some(order)) = (doc, order.as_array()) else {
        return;
    };
    let rank = |x: &Value| -> usize {
        order
            .iter()
            .position(|o| match strategy {
                Some(ListMerge::Key(k)) => o.get(k).is_some() && o.get(k) == x.get(k),
                _ => o == x,
            })
            .unwrap_or(usize::MAX)
    };
    list.sort_by_key(|x| rank(x));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const DEPLOYMENT: &str = "io.k8s.api.apps.v1.Deployment";

    fn deployment() -> Value {
        json!({"metadata": {"name": "web", "labels": {"app": "web", "tier": "front"}, "finalizers": ["a"]},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}],
                 "ports": [{"containerPort": 80}]},
                {"name": "sidecar", "image": "side:1"}]}}}})
    }

    #[test]
    fn containers_merge_by_name_and_env_by_name() {
        let mut d = deployment();
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "app", "image": "app:2", "env": [{"name": "B", "value": "2"}]}]}}}});
        strategic_merge(&mut d, patch.to_string().as_bytes(), DEPLOYMENT).expect("applies");
        let cs = &d["spec"]["template"]["spec"]["containers"];
        assert_eq!(cs.as_array().expect("list").len(), 2, "sidecar kept");
        assert_eq!(cs[0]["image"], "app:2");
        assert_eq!(cs[0]["env"].as_array().expect("env").len(), 2);
        assert_eq!(
            cs[0]["ports"][0]["containerPort"], 80,
            "untouched fields kept"
        );
        assert_eq!(cs[1]["name"], "sidecar");
    }

    #[test]
    fn directives_delete_replace_and_order() {
        let mut d = deployment();
        let patch = json!({
            "metadata": {"labels": {"tier": null}, "$deleteFromPrimitiveList/finalizers": ["a"]},
            "spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "sidecar"}, {"name": "app"}],
                "containers": [{"name": "app", "$patch": "delete"}, {"name": "new", "image": "n"}]}}}});
        strategic_merge(&mut d, patch.to_string().as_bytes(), DEPLOYMENT).expect("applies");
        assert_eq!(d["metadata"]["labels"], json!({"app": "web"}));
        assert_eq!(d["metadata"]["finalizers"], json!([]));
        let names: Vec<&str> = d["spec"]["template"]["spec"]["containers"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(names, vec!["sidecar", "new"]);
        let mut d = deployment();
        let patch = json!({"spec": {"template": {"spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "o"}]}}}});
        strategic_merge(&mut d, patch.to_string().as_bytes(), DEPLOYMENT).expect("applies");
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"],
            json!([{"name": "only", "image": "o"}])
        );
    }

    #[test]
    fn atomic_lists_are_replaced_and_sets_unioned() {
        let mut d = json!({"metadata": {"finalizers": ["a"]}, "spec": {"template": {"spec": {
            "tolerations": [{"key": "x"}], "containers": [{"name": "c", "args": ["1", "2"]}]}}}});
        let patch = json!({"metadata": {"finalizers": ["b"]}, "spec": {"template": {"spec": {
            "tolerations": [{"key": "y"}], "containers": [{"name": "c", "args": ["3"]}]}}}});
        strategic_merge(&mut d, patch.to_string().as_bytes(), DEPLOYMENT).expect("applies");
        assert_eq!(d["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(
            d["spec"]["template"]["spec"]["tolerations"],
            json!([{"key": "y"}])
        );
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["args"],
            json!(["3"])
        );
    }

    #[test]
    fn bad_patches_are_errors_not_panics() {
        let mut d = deployment();
        for bad in [
            "[]",
            "not json",
            r#"{"$patch": "explode"}"#,
            r#"{"spec": {"template": {"spec": {"containers": [{"image": "no name"}]}}}}"#,
            r#"{"$unknown": 1}"#,
        ] {
            assert!(
                strategic_merge(&mut d, bad.as_bytes(), DEPLOYMENT).is_err(),
                "{bad}"
            );
        }
        assert!(json_patch(&mut d, br#"[{"op": "remove", "path": "/nope"}]"#).is_err());
        assert!(merge_patch(&mut d, b"[1]").is_err());
        json_patch(
            &mut d,
            br#"[{"op": "replace", "path": "/spec/replicas", "value": 5}]"#,
        )
        .expect("valid");
        assert_eq!(d["spec"]["replicas"], 5);
    }
}
