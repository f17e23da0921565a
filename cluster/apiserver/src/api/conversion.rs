//! CRD conversion webhooks (`spec.conversion.strategy: Webhook`) on the request path, as
//! kube-apiserver runs them: a custom object is stored in the CRD's storage version, and
//! every object that crosses the store's edge in another version goes to the webhook in a
//! ConversionReview — a request's object on its way in (create, update, patch, apply, the
//! status and scale subresources), the stored object on its way out (get, list, watch, the
//! answer of a write or a delete), and the stored object an update or patch starts from. In
//! between, defaulting, validation, admission and the printer columns see the object in
//! the version the request is for.
//!
//! Objects already in the wanted version never go to the webhook, so a request in the
//! storage version of a CRD whose objects were all written in it costs nothing extra. A
//! list goes in as few reviews as fit [`REVIEW_OBJECTS`] objects and [`REVIEW_BYTES`]
//! bytes each; a watch converts each event as it passes and ends with an error event when
//! the webhook fails (a client lists again, as after any broken watch).
//!
//! What the webhook answers is checked as Kubernetes checks it: the review's uid, one
//! object back per object sent, each of the kind sent in the version asked for; of the
//! metadata only labels and annotations may change — everything else is kept from the
//! object sent. A webhook that cannot be called, answers `Failure` or answers wrongly
//! fails the request with a 500 that names the CRD's kind and the reason; nothing is
//! written.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Map, Value, json};

use super::{Api, ApiResponse, WatchEvent};
use crate::crd::{Conversion, Version};
use crate::status::ApiError;

/// How long a conversion webhook may take (kube-apiserver's fixed 30 s: a CRD's
/// conversion has no timeout of its own).
const TIMEOUT: Duration = Duration::from_secs(30);

/// Objects sent in one ConversionReview, at most.
pub const REVIEW_OBJECTS: usize = 500;

/// Bytes of objects sent in one ConversionReview, at most (a single larger object goes
/// alone).
pub const REVIEW_BYTES: usize = 1 << 20;

/// Largest ConversionReview answer read.
const MAX_ANSWER: usize = 32 << 20;

impl Api {
    /// The conversion webhook of a custom resource's CRD, if it has one.
    pub(super) fn conversion(&self, res: &crate::catalog::Resource) -> Option<Arc<Conversion>> {
        self.custom(res).and_then(|v| v.conversion.clone())
    }

    /// `obj` in `desired` (an apiVersion), converted by the webhook if it is in another.
    pub(super) async fn convert_one(
        &self,
        conversion: &Conversion,
        desired: &str,
        mut obj: Value,
    ) -> Result<Value, ApiError> {
        self.convert(conversion, desired, vec![&mut obj]).await?;
        Ok(obj)
    }

    /// Converts, in place, the objects among `objects` that are not in `desired`.
    pub(super) async fn convert(
        &self,
        conversion: &Conversion,
        desired: &str,
        objects: Vec<&mut Value>,
    ) -> Result<(), ApiError> {
        let mut pending: Vec<&mut Value> = objects
            .into_iter()
            .filter(|o| {
                o["kind"] == conversion.kind.as_str()
                    && o["apiVersion"].as_str().is_some_and(|v| v != desired)
            })
            .collect();
        while !pending.is_empty() {
            // One review: as many objects as fit, at least one.
            let mut texts = Vec::new();
            let mut bytes = 0;
            for o in pending.iter() {
                let text =
                    serde_json::to_vec(&**o).map_err(|e| ApiError::internal(e.to_string()))?;
                if !texts.is_empty()
                    && (texts.len() == REVIEW_OBJECTS || bytes + text.len() > REVIEW_BYTES)
                {
                    break;
                }
                bytes += text.len();
                texts.push(text);
            }
            let rest = pending.split_off(texts.len());
            let from = pending[0]["apiVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let converted = self
                .conversion_review(conversion, desired, &texts)
                .await
                .map_err(|why| {
                    ApiError::internal(format!(
                        "conversion webhook for {from}, Kind={} failed: {why}",
                        conversion.kind
                    ))
                })?;
            for (o, c) in pending.into_iter().zip(converted) {
                *o = restored(o, c);
            }
            pending = rest;
        }
        Ok(())
    }

    /// One ConversionReview of `objects` (their JSON texts) to `desired`: the objects the
    /// webhook answered, checked; or why the conversion failed.
    async fn conversion_review(
        &self,
        conversion: &Conversion,
        desired: &str,
        objects: &[Vec<u8>],
    ) -> Result<Vec<Value>, String> {
        let uid = super::uid();
        // The objects go in as the texts already made.
        let mut body = format!(
            r#"{{"apiVersion":"apiextensions.k8s.io/{}","kind":"ConversionReview","request":{{"uid":{},"desiredAPIVersion":{},"objects":["#,
            conversion.review_version,
            json!(uid),
            json!(desired),
        )
        .into_bytes();
        for (i, text) in objects.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(text);
        }
        body.extend_from_slice(b"]}}");
        let started = Instant::now();
        let answer = tokio::time::timeout(TIMEOUT, async {
            let target = self.webhook_target(&conversion.endpoint, TIMEOUT).await?;
            self.webhooks
                .caller
                .post_limited(&target, conversion.ca_pem.as_ref(), body, MAX_ANSWER)
                .await
        })
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "context deadline exceeded (a conversion webhook has {}s)",
                TIMEOUT.as_secs()
            ))
        });
        let result = answer.map_err(Refusal::Error).and_then(|bytes| {
            converted_objects(&bytes, &uid, desired, objects.len(), &conversion.kind)
        });
        let outcome = match &result {
            Ok(_) => "success",
            Err(Refusal::Failure(_)) => "failure",
            Err(Refusal::Error(_)) => "error",
        };
        if let Some(m) = &self.metrics {
            m.conversion_calls
                .with_label_values(&[conversion.crd.as_str(), outcome])
                .inc();
            m.conversion_duration
                .with_label_values(&[conversion.crd.as_str()])
                .observe(started.elapsed().as_secs_f64());
            if result.is_ok() {
                m.conversion_objects
                    .with_label_values(&[conversion.crd.as_str()])
                    .inc_by(objects.len() as u64);
            }
        }
        result.map_err(|r| {
            let why = r.to_string();
            tracing::warn!(crd = %conversion.crd, desired, error = %why, "conversion webhook failed");
            why
        })
    }

    /// An answer for a request in `version` of a CRD: every object of the CRD's kind in it
    /// (alone, a list's items, each watch event's) in that version — converted by the
    /// webhook, or, for a CRD without one, relabelled (versions then differ only in
    /// `apiVersion`).
    pub(super) async fn in_request_version(
        &self,
        version: &Arc<Version>,
        resp: ApiResponse,
    ) -> Result<ApiResponse, ApiError> {
        let Some(conversion) = version.conversion.clone() else {
            return super::custom::in_version(version, resp);
        };
        let desired = super::api_version(version.resource);
        match super::views::decoded(resp)? {
            ApiResponse::Object {
                code,
                mut body,
                warnings,
            } => {
                self.convert(&conversion, &desired, of_kind(&conversion, &mut body))
                    .await?;
                Ok(ApiResponse::Object {
                    code,
                    body,
                    warnings,
                })
            }
            ApiResponse::Watch(stream) => {
                let api = self.clone();
                let converted = stream.then(move |ev| {
                    let (api, conversion, desired) =
                        (api.clone(), conversion.clone(), desired.clone());
                    async move {
                        let mut ev = ev.into_value();
                        if ev["type"] == "ERROR" {
                            return (WatchEvent::Value(ev), false);
                        }
                        let bookmark = ev["type"] == "BOOKMARK";
                        let object = &mut ev["object"];
                        if bookmark || object["kind"] != conversion.kind.as_str() {
                            // A bookmark carries only metadata: its apiVersion is all there is.
                            if object.is_object() {
                                object["apiVersion"] = json!(desired);
                            }
                            return (WatchEvent::Value(ev), false);
                        }
                        match api.convert(&conversion, &desired, vec![object]).await {
                            Ok(()) => (WatchEvent::Value(ev), false),
                            Err(e) => (
                                WatchEvent::Value(
                                    json!({"type": "ERROR", "object": e.to_status()}),
                                ),
                                true,
                            ),
                        }
                    }
                });
                // The event that reports a failed conversion is the watch's last.
                let last = converted.scan(false, |ended, (ev, failed)| {
                    let next = (!*ended).then_some(ev);
                    *ended |= failed;
                    std::future::ready(next)
                });
                Ok(ApiResponse::Watch(Box::pin(last)))
            }
            other => Ok(other),
        }
    }
}

/// The objects of the converted kind in an answer's body: the body itself, or a list's
/// items.
fn of_kind<'a>(conversion: &Conversion, body: &'a mut Value) -> Vec<&'a mut Value> {
    if body["kind"] == conversion.kind.as_str() {
        return vec![body];
    }
    match body.get_mut("items").and_then(Value::as_array_mut) {
        Some(items) => items.iter_mut().collect(),
        None => Vec::new(),
    }
}

/// Why a conversion failed.
enum Refusal {
    /// The webhook answered `Failure`.
    Failure(String),
    /// It could not be called, or its answer is not a usable ConversionReview.
    Error(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Failure(m) | Refusal::Error(m) => f.write_str(m),
        }
    }
}

impl From<String> for Refusal {
    fn from(why: String) -> Self {
        Refusal::Error(why)
    }
}

/// The converted objects of a ConversionReview answer, checked against what was sent.
fn converted_objects(
    bytes: &[u8],
    uid: &str,
    desired: &str,
    sent: usize,
    kind: &str,
) -> Result<Vec<Value>, Refusal> {
    let review: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("the answer is not a ConversionReview: {e}"))?;
    let response = &review["response"];
    if !response.is_object() {
        return Err("the ConversionReview answer has no response"
            .to_owned()
            .into());
    }
    if response["uid"] != uid {
        return Err(format!("expected response uid {uid:?}, got {}", response["uid"]).into());
    }
    if response["result"]["status"] != "Success" {
        let message = response["result"]["message"].as_str().unwrap_or_default();
        return Err(Refusal::Failure(if message.is_empty() {
            "the webhook answered Failure".to_owned()
        } else {
            message.to_owned()
        }));
    }
    let Some(objects) = response["convertedObjects"].as_array() else {
        return Err("the answer has no convertedObjects".to_owned().into());
    };
    if objects.len() != sent {
        return Err(format!(
            "returned objects counts does not match: sent {sent}, got {}",
            objects.len()
        )
        .into());
    }
    for (i, o) in objects.iter().enumerate() {
        if o["apiVersion"] != desired {
            return Err(format!(
                "invalid converted object at index {i}: expected apiVersion {desired:?}, got {}",
                o["apiVersion"]
            )
            .into());
        }
        if o["kind"] != kind {
            return Err(format!(
                "invalid converted object at index {i}: expected kind {kind:?}, got {}",
                o["kind"]
            )
            .into());
        }
        let meta = &o["metadata"];
        if !meta.is_object() {
            return Err(format!("invalid converted object at index {i}: missing metadata").into());
        }
        for key in ["labels", "annotations"] {
            let field = &meta[key];
            let strings = field
                .as_object()
                .is_some_and(|m| m.values().all(Value::is_string));
            if !field.is_null() && !strings {
                return Err(format!(
                    "invalid converted object at index {i}: metadata.{key} must map strings to strings"
                )
                .into());
            }
        }
    }
    Ok(review["response"]["convertedObjects"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// The object the webhook converted, with the metadata of the one sent: only labels and
/// annotations are taken from the webhook (as Kubernetes restores it).
fn restored(original: &Value, mut converted: Value) -> Value {
    let mut meta = original["metadata"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let theirs: Map<String, Value> = converted["metadata"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for key in ["labels", "annotations"] {
        match theirs
            .get(key)
            .filter(|v| v.as_object().is_some_and(|m| !m.is_empty()))
        {
            Some(v) => {
                meta.insert(key.to_owned(), v.clone());
            }
            None => {
                meta.remove(key);
            }
        }
    }
    converted["metadata"] = Value::Object(meta);
    converted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(uid: &str, objects: Value) -> Vec<u8> {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "response": {"uid": uid, "result": {"status": "Success"}, "convertedObjects": objects},
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn answers_are_checked_against_what_was_sent() {
        let good = json!([{"apiVersion": "x.io/v2", "kind": "Thing", "metadata": {"name": "a"}}]);
        let ok = converted_objects(&answer("u1", good.clone()), "u1", "x.io/v2", 1, "Thing");
        assert_eq!(ok.ok().map(|o| o.len()), Some(1));
        let cases: [(&[u8], &str); 7] = [
            (&answer("u2", good.clone()), "expected response uid"),
            (&answer("u1", json!([])), "counts does not match"),
            (
                &answer(
                    "u1",
                    json!([{"apiVersion": "x.io/v1", "kind": "Thing", "metadata": {}}]),
                ),
                "expected apiVersion \"x.io/v2\"",
            ),
            (
                &answer(
                    "u1",
                    json!([{"apiVersion": "x.io/v2", "kind": "Other", "metadata": {}}]),
                ),
                "expected kind \"Thing\"",
            ),
            (
                &answer(
                    "u1",
                    json!([{"apiVersion": "x.io/v2", "kind": "Thing", "metadata": {"labels": {"a": 1}}}]),
                ),
                "metadata.labels must map strings to strings",
            ),
            (
                &answer("u1", json!([{"apiVersion": "x.io/v2", "kind": "Thing"}])),
                "missing metadata",
            ),
            (b"<html>", "not a ConversionReview"),
        ];
        for (bytes, want) in cases {
            match converted_objects(bytes, "u1", "x.io/v2", 1, "Thing") {
                Err(Refusal::Error(why)) => assert!(why.contains(want), "{why} lacks {want}"),
                Err(Refusal::Failure(why)) => panic!("{want}: a Failure: {why}"),
                Ok(_) => panic!("{want}: accepted"),
            }
        }
        let failure = json!({"response": {"uid": "u1", "result": {"status": "Failure", "message": "no v3 here"}}});
        match converted_objects(failure.to_string().as_bytes(), "u1", "x.io/v2", 1, "Thing") {
            Err(Refusal::Failure(why)) => assert_eq!(why, "no v3 here"),
            _ => panic!("a Failure answer was not reported as one"),
        }
    }

    #[test]
    fn only_labels_and_annotations_come_from_the_webhook() {
        let original = json!({
            "apiVersion": "x.io/v1", "kind": "Thing",
            "metadata": {"name": "a", "uid": "1", "resourceVersion": "7", "labels": {"k": "v"}},
            "spec": {"old": 1},
        });
        let converted = json!({
            "apiVersion": "x.io/v2", "kind": "Thing",
            "metadata": {"name": "renamed", "uid": "2", "annotations": {"n": "m"}},
            "spec": {"new": 1},
        });
        let out = restored(&original, converted);
        assert_eq!(out["metadata"]["name"], "a");
        assert_eq!(out["metadata"]["uid"], "1");
        assert_eq!(out["metadata"]["resourceVersion"], "7");
        assert_eq!(out["metadata"]["annotations"], json!({"n": "m"}));
        assert!(out["metadata"].get("labels").is_none(), "{out}");
        assert_eq!(out["spec"], json!({"new": 1}));
        assert_eq!(out["apiVersion"], "x.io/v2");
    }
}
