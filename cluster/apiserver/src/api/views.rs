//! Older versions of stored kinds ([`crate::catalog::VIEWS`]), served by converting at the
//! API's edge as kube-apiserver converts to and from its storage version: a request body in
//! the older version becomes the stored one before anything else sees it, a patch applies to
//! the object as the older version shows it, and every answer (objects, lists, tables, watch
//! events) is converted back. Admission, validation, the store and controllers see only the
//! stored version.
//!
//! The one view is `autoscaling/v1` HorizontalPodAutoscalers over `autoscaling/v2`. Version
//! 1 has a CPU utilization target only; what it cannot hold travels in Kubernetes'
//! annotations (`autoscaling.alpha.kubernetes.io/metrics`, `.../behavior`,
//! `.../current-metrics`, `.../conditions`), so a read-modify-write through v1 keeps it.
//! Their values here are the `autoscaling/v2` JSON of those fields.

use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Map, Value, json};

use super::ApiResponse;
use crate::catalog::Resource;
use crate::request::{ApiRequest, Verb};
use crate::status::ApiError;
use tessera_client::response::WatchEvent;

/// The annotations v1 keeps what it cannot express in.
const METRICS: &str = "autoscaling.alpha.kubernetes.io/metrics";
const CURRENT_METRICS: &str = "autoscaling.alpha.kubernetes.io/current-metrics";
const CONDITIONS: &str = "autoscaling.alpha.kubernetes.io/conditions";
const BEHAVIOR: &str = "autoscaling.alpha.kubernetes.io/behavior";

/// Makes a request for a view a request for the stored version: its resource, and the body
/// of a create or update converted. Returns the view, to convert the answer with
/// [`answer`], or `None` for a stored version.
pub(super) fn to_stored(req: &mut ApiRequest) -> Result<Option<&'static Resource>, ApiError> {
    let Some(stored) = crate::catalog::stored_version_of(req.resource) else {
        return Ok(None);
    };
    let view = req.resource;
    req.resource = stored;
    if matches!(req.verb, Verb::Create | Verb::Update) {
        let body = match req.object.take() {
            Some(o) => o.into_value(),
            None => serde_json::from_slice(&req.body).map_err(|e| {
                ApiError::bad_request(format!(
                    "the request body is not valid JSON: {e}; send one {} object",
                    view.kind
                ))
            })?,
        };
        req.body = Bytes::from(from_view(view, body)?.to_string());
    }
    Ok(Some(view))
}

/// `object` (of the stored version) as `view` shows it.
pub(super) fn to_view(view: &Resource, object: &Value) -> Value {
    match (view.group, view.version, view.kind) {
        ("autoscaling", "v1", "HorizontalPodAutoscaler") => hpa_v2_to_v1(object),
        _ => object.clone(),
    }
}

/// `object`, written in `view`'s version, as the stored version.
pub(super) fn from_view(view: &Resource, object: Value) -> Result<Value, ApiError> {
    if !object.is_object() {
        return Err(ApiError::bad_request(format!(
            "the request body is not an object: send one {} object",
            view.kind
        )));
    }
    if object["apiVersion"] != api_version(view) && !object["apiVersion"].is_null() {
        return Err(ApiError::bad_request(format!(
            "the object's apiVersion is {}, not {}: send it to its own version's path",
            object["apiVersion"],
            api_version(view)
        )));
    }
    Ok(match (view.group, view.version, view.kind) {
        ("autoscaling", "v1", "HorizontalPodAutoscaler") => hpa_v1_to_v2(object),
        _ => object,
    })
}

fn api_version(res: &Resource) -> String {
    if res.group.is_empty() {
        res.version.to_owned()
    } else {
        format!("{}/{}", res.group, res.version)
    }
}

/// An answer of the stored version converted for `view`: each object of the kind in it
/// (alone, in a list, in a Table's rows, in watch events), anything else as it is.
pub(super) fn answer(view: &'static Resource, resp: ApiResponse) -> Result<ApiResponse, ApiError> {
    map_answer(resp, move |v: &mut Value| convert_in(view, v))
}

/// `resp` with `fix` applied to its body, or to each watch event's object (not to errors).
pub(super) fn map_answer(
    resp: ApiResponse,
    fix: impl Fn(&mut Value) + Send + Sync + 'static,
) -> Result<ApiResponse, ApiError> {
    Ok(match decoded(resp)? {
        ApiResponse::Object {
            code,
            mut body,
            warnings,
        } => {
            fix(&mut body);
            ApiResponse::Object {
                code,
                body,
                warnings,
            }
        }
        ApiResponse::Watch(stream) => ApiResponse::Watch(Box::pin(stream.map(move |ev| {
            let mut ev = ev.into_value();
            if ev["type"] != "ERROR" {
                fix(&mut ev["object"]);
            }
            WatchEvent::Value(ev)
        }))),
        other => other,
    })
}

/// `resp` with an encoded body decoded into an object (anything else as it is).
pub(super) fn decoded(resp: ApiResponse) -> Result<ApiResponse, ApiError> {
    Ok(match resp {
        ApiResponse::Encoded { code, body } => ApiResponse::Object {
            code,
            body: serde_json::from_slice(&body)
                .map_err(|e| ApiError::internal(format!("stored object is not JSON: {e}")))?,
            warnings: Vec::new(),
        },
        other => other,
    })
}

/// Converts `v` in place where it is an object of the view's kind, or holds some.
fn convert_in(view: &Resource, v: &mut Value) {
    let one = |o: &mut Value| {
        // A bookmark carries only metadata: its apiVersion is all there is to change.
        if o.get("spec").is_some() {
            *o = to_view(view, o);
        } else if o.is_object() {
            o["apiVersion"] = json!(api_version(view));
        }
    };
    if v["kind"] == view.kind {
        one(v);
        return;
    }
    let is_list = v["kind"].as_str() == Some(&format!("{}List", view.kind));
    if is_list {
        v["apiVersion"] = json!(api_version(view));
        for item in v["items"].as_array_mut().into_iter().flatten() {
            one(item);
        }
    }
    for row in v
        .get_mut("rows")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if row["object"]["kind"] == view.kind {
            one(&mut row["object"]);
        }
    }
}

fn annotations_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj["metadata"]["annotations"].is_object() {
        obj["metadata"]["annotations"] = json!({});
    }
    obj["metadata"]["annotations"]
        .as_object_mut()
        .expect("just made an object")
}

/// Whether `m` is a CPU utilization metric (what v1's `targetCPUUtilizationPercentage` is).
fn is_cpu_utilization(m: &Value) -> bool {
    m["type"] == "Resource"
        && m["resource"]["name"] == "cpu"
        && m["resource"]["target"]["type"] == "Utilization"
}

/// `autoscaling/v2` → `autoscaling/v1`.
fn hpa_v2_to_v1(v2: &Value) -> Value {
    let mut out = json!({
        "kind": "HorizontalPodAutoscaler",
        "apiVersion": "autoscaling/v1",
        "metadata": v2["metadata"].clone(),
    });
    let spec = &v2["spec"];
    let mut v1_spec = json!({"scaleTargetRef": spec["scaleTargetRef"]});
    if !spec["minReplicas"].is_null() {
        v1_spec["minReplicas"] = spec["minReplicas"].clone();
    }
    v1_spec["maxReplicas"] = spec["maxReplicas"].clone();
    let metrics = spec["metrics"].as_array().map_or(&[][..], Vec::as_slice);
    let cpu = metrics.iter().position(is_cpu_utilization);
    if let Some(i) = cpu {
        v1_spec["targetCPUUtilizationPercentage"] =
            metrics[i]["resource"]["target"]["averageUtilization"].clone();
    }
    let others: Vec<&Value> = metrics
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != cpu)
        .map(|(_, m)| m)
        .collect();
    let mut extra = Vec::new();
    if !others.is_empty() {
        extra.push((METRICS, json!(others).to_string()));
    }
    if spec["behavior"].is_object() {
        extra.push((BEHAVIOR, spec["behavior"].to_string()));
    }
    out["spec"] = v1_spec;
    let status = &v2["status"];
    let mut v1_status = json!({});
    for key in ["observedGeneration", "lastScaleTime"] {
        if !status[key].is_null() {
            v1_status[key] = status[key].clone();
        }
    }
    v1_status["currentReplicas"] = json!(status["currentReplicas"].as_i64().unwrap_or(0));
    v1_status["desiredReplicas"] = json!(status["desiredReplicas"].as_i64().unwrap_or(0));
    let current = status["currentMetrics"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let cpu_now = current
        .iter()
        .position(|m| m["type"] == "Resource" && m["resource"]["name"] == "cpu");
    if let Some(i) = cpu_now
        && let Some(u) = current[i]["resource"]["current"]["averageUtilization"].as_i64()
    {
        v1_status["currentCPUUtilizationPercentage"] = json!(u);
    }
    let other_now: Vec<&Value> = current
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != cpu_now)
        .map(|(_, m)| m)
        .collect();
    if !other_now.is_empty() {
        extra.push((CURRENT_METRICS, json!(other_now).to_string()));
    }
    if status["conditions"]
        .as_array()
        .is_some_and(|c| !c.is_empty())
    {
        extra.push((CONDITIONS, status["conditions"].to_string()));
    }
    out["status"] = v1_status;
    if !extra.is_empty() {
        let annotations = annotations_mut(&mut out);
        for (k, v) in extra {
            annotations.insert(k.into(), json!(v));
        }
    }
    out
}

/// `autoscaling/v1` → `autoscaling/v2`: the CPU target becomes a metric after those the
/// annotations carry; the annotations go.
fn hpa_v1_to_v2(mut v1: Value) -> Value {
    let mut taken = Map::new();
    if let Some(a) = v1["metadata"]
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    {
        for key in [METRICS, CURRENT_METRICS, CONDITIONS, BEHAVIOR] {
            if let Some(v) = a.remove(key) {
                taken.insert(key.into(), v);
            }
        }
        if a.is_empty() {
            v1["metadata"]
                .as_object_mut()
                .map(|m| m.remove("annotations"));
        }
    }
    // An annotation that is not the JSON it should be is dropped, as Kubernetes drops it.
    let parsed = |key: &str| -> Option<Value> {
        taken
            .get(key)?
            .as_str()
            .and_then(|s| serde_json::from_str(s).ok())
    };
    let spec = &v1["spec"];
    let mut metrics: Vec<Value> = parsed(METRICS)
        .and_then(|m| m.as_array().cloned())
        .unwrap_or_default();
    if let Some(t) = spec["targetCPUUtilizationPercentage"].as_i64() {
        metrics.push(json!({"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": t}}}));
    }
    let mut v2_spec = json!({"scaleTargetRef": spec["scaleTargetRef"]});
    if !spec["minReplicas"].is_null() {
        v2_spec["minReplicas"] = spec["minReplicas"].clone();
    }
    v2_spec["maxReplicas"] = spec["maxReplicas"].clone();
    if !metrics.is_empty() {
        v2_spec["metrics"] = json!(metrics);
    }
    if let Some(b) = parsed(BEHAVIOR).filter(Value::is_object) {
        v2_spec["behavior"] = b;
    }
    let status = &v1["status"];
    let mut v2_status = json!({});
    for key in [
        "observedGeneration",
        "lastScaleTime",
        "currentReplicas",
        "desiredReplicas",
    ] {
        if !status[key].is_null() {
            v2_status[key] = status[key].clone();
        }
    }
    let mut current: Vec<Value> = parsed(CURRENT_METRICS)
        .and_then(|m| m.as_array().cloned())
        .unwrap_or_default();
    if let Some(u) = status["currentCPUUtilizationPercentage"].as_i64() {
        current.insert(
            0,
            json!({"type": "Resource", "resource": {"name": "cpu",
            "current": {"averageUtilization": u}}}),
        );
    }
    if !current.is_empty() {
        v2_status["currentMetrics"] = json!(current);
    }
    if let Some(c) = parsed(CONDITIONS).filter(Value::is_array) {
        v2_status["conditions"] = c;
    }
    let had_status = !status.is_null();
    let mut out = json!({
        "kind": "HorizontalPodAutoscaler",
        "apiVersion": "autoscaling/v2",
        "metadata": v1["metadata"].take(),
        "spec": v2_spec,
    });
    if had_status || v2_status.as_object().is_some_and(|s| !s.is_empty()) {
        out["status"] = v2_status;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> &'static Resource {
        crate::catalog::find("autoscaling", "v1", "horizontalpodautoscalers").expect("view")
    }

    #[test]
    fn a_v1_cpu_target_is_a_v2_metric_and_back() {
        let v1 = json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "api", "namespace": "t1"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api"},
                "minReplicas": 2, "maxReplicas": 5, "targetCPUUtilizationPercentage": 50}});
        let v2 = from_view(view(), v1.clone()).expect("converts");
        assert_eq!(v2["apiVersion"], "autoscaling/v2");
        assert_eq!(
            v2["spec"]["metrics"],
            json!([{"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 50}}}])
        );
        let back = to_view(view(), &v2);
        assert_eq!(back["spec"], v1["spec"]);
        assert!(back["metadata"]["annotations"].is_null(), "{back}");
    }

    #[test]
    fn what_v1_cannot_hold_survives_a_round_trip_through_annotations() {
        let v2 = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "api", "namespace": "t1", "annotations": {"team": "a"}},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "api"}, "minReplicas": 1,
                "maxReplicas": 9,
                "metrics": [
                    {"type": "Resource", "resource": {"name": "memory",
                        "target": {"type": "AverageValue", "averageValue": "100Mi"}}},
                    {"type": "Resource", "resource": {"name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 70}}}],
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60,
                    "selectPolicy": "Max",
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 30}]}}},
            "status": {"currentReplicas": 3, "desiredReplicas": 4,
                "currentMetrics": [
                    {"type": "Resource", "resource": {"name": "cpu",
                        "current": {"averageUtilization": 91, "averageValue": "91m"}}}],
                "conditions": [{"type": "AbleToScale", "status": "True",
                    "reason": "ReadyForNewScale"}]}});
        let v1 = to_view(view(), &v2);
        assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 70);
        assert_eq!(v1["status"]["currentCPUUtilizationPercentage"], 91);
        assert_eq!(v1["metadata"]["annotations"]["team"], "a");
        for key in [METRICS, BEHAVIOR, CONDITIONS] {
            assert!(
                v1["metadata"]["annotations"][key].is_string(),
                "{key}: {v1}"
            );
        }
        let again = from_view(view(), v1).expect("converts");
        assert_eq!(again["metadata"]["annotations"], json!({"team": "a"}));
        assert_eq!(again["spec"]["behavior"], v2["spec"]["behavior"]);
        assert_eq!(again["status"]["conditions"], v2["status"]["conditions"]);
        // The CPU target goes after the metrics the annotation kept.
        assert_eq!(again["spec"]["metrics"][0], v2["spec"]["metrics"][0]);
        assert_eq!(again["spec"]["metrics"][1], v2["spec"]["metrics"][1]);
        assert_eq!(again["status"]["currentReplicas"], 3);
    }

    #[test]
    fn an_object_of_another_version_is_refused_and_answers_are_converted() {
        let wrong = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "x"}, "spec": {"maxReplicas": 1}});
        let e = from_view(view(), wrong).expect_err("refused");
        assert_eq!(e.code, 400);
        assert!(e.message.contains("autoscaling/v1"), "{}", e.message);
        for not_an_object in [json!([1]), json!("x"), json!(null)] {
            let e = from_view(view(), not_an_object).expect_err("refused");
            assert_eq!(e.code, 400, "{}", e.message);
        }
        let mut list = json!({"kind": "HorizontalPodAutoscalerList", "apiVersion": "autoscaling/v2",
            "items": [{"kind": "HorizontalPodAutoscaler", "apiVersion": "autoscaling/v2",
                "metadata": {"name": "a"}, "spec": {"maxReplicas": 3, "metrics": []}}]});
        convert_in(view(), &mut list);
        assert_eq!(list["apiVersion"], "autoscaling/v1");
        assert_eq!(list["items"][0]["apiVersion"], "autoscaling/v1");
        assert_eq!(list["items"][0]["spec"]["maxReplicas"], 3);
        let mut bookmark = json!({"kind": "HorizontalPodAutoscaler", "apiVersion": "autoscaling/v2",
            "metadata": {"resourceVersion": "9"}});
        convert_in(view(), &mut bookmark);
        assert_eq!(bookmark["apiVersion"], "autoscaling/v1");
        assert!(bookmark.get("spec").is_none());
    }
}
