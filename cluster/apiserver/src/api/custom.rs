//! Custom resources on the request path: the CRD version a request is for, the schema's
//! pruning, defaulting and validation of a body, the CRD kind's own status and checks, and
//! `apiVersion` on reads of a CRD that serves more than one version (conversion `None`:
//! objects differ between versions only in it).

use super::*;
use crate::crd::{self, ScalePaths, Version};

impl Api {
    /// The served CRD version of a custom resource (None for a built-in one).
    pub(super) fn custom(&self, res: &Resource) -> Option<Arc<Version>> {
        if !res.custom {
            return None;
        }
        self.crds.current().version(res).cloned()
    }

    /// The scale subresource's paths of a custom resource.
    pub(super) fn scale_paths(&self, res: &Resource) -> Option<ScalePaths> {
        self.custom(res).and_then(|v| v.scale.clone())
    }

    /// What a request of a custom resource must pass before it is handled: its CRD is still
    /// served, creates wait for no terminating CRD, and strategic merge patches (which need
    /// Go types) are refused as Kubernetes refuses them.
    pub(super) async fn custom_gate(
        &self,
        req: &ApiRequest,
    ) -> Result<Option<Arc<Version>>, ApiError> {
        if !req.resource.custom {
            return Ok(None);
        }
        let snapshot = self.crds.snapshot().await?;
        let Some(version) = snapshot.version(req.resource).cloned() else {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!(
                    "the server could not find the requested resource ({} in {}): its CustomResourceDefinition is gone",
                    req.resource.plural,
                    api_version(req.resource)
                ),
            ));
        };
        if version.terminating && req.verb == Verb::Create {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!(
                    "create not allowed while custom resource definition {}.{} is terminating",
                    req.resource.plural, req.resource.group
                ),
            ));
        }
        if req.verb == Verb::Patch(PatchType::StrategicMerge) {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (strategic merge patch needs the built-in types: custom resources take a merge patch, `kubectl patch --type=merge`)",
            ));
        }
        Ok(Some(version))
    }

    /// A custom object's body as the server keeps it: metadata of ObjectMeta's types, the
    /// fields the schema does not declare pruned (and reported per `fieldValidation`), the
    /// schema's defaults filled in. Its values are validated later, with the object whole.
    pub(super) fn typed_custom(
        &self,
        req: &ApiRequest,
        version: &Version,
        mut obj: Value,
    ) -> Result<(Value, Vec<String>), ApiError> {
        let res = req.resource;
        let meta = obj.get("metadata").cloned().unwrap_or(json!({}));
        let meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta =
            serde_path_to_error::deserialize(&meta).map_err(|e| {
                ApiError::bad_request(format!(
                    "{kind} in version \"{v}\" cannot be handled as a {kind}: metadata.{path}: {msg}",
                    kind = res.kind,
                    v = res.version,
                    path = e.path(),
                    msg = e.inner()
                ))
            })?;
        obj["metadata"] =
            serde_json::to_value(meta).map_err(|e| ApiError::internal(e.to_string()))?;
        let unknown = version.schema.prune(&mut obj);
        let mut warnings = super::write::unknown_field_warnings(req, &unknown)?;
        version.schema.default(&mut obj);
        if let Some(w) = &version.deprecation {
            warnings.push(w.clone());
        }
        Ok((obj, warnings))
    }

    /// Checks beyond [`validation::validate`]: a custom object against its schema, a CRD as
    /// Kubernetes checks one (`current`: the stored CRD, for what may not change).
    pub(super) fn validate_more(
        &self,
        res: &Resource,
        obj: &Value,
        current: Option<&Value>,
        causes: &mut Vec<Cause>,
    ) {
        if let Some(v) = self.custom(res) {
            let (found, tally) = v.schema.validate_tallied(obj, current);
            causes.extend(found);
            if let Some(m) = &self.metrics {
                for (result, n) in [
                    ("passed", tally.passed),
                    ("failed", tally.failed),
                    ("error", tally.errors),
                ] {
                    if n > 0 {
                        m.crd_rules.with_label_values(&[result]).inc_by(n);
                    }
                }
            }
        } else if is_crd(res) {
            crd::validate_definition(obj, current, causes);
        } else if crate::apiservices::is_apiservice(res) {
            crate::apiservices::validate(obj, causes);
        } else if crate::csr::is_csr(res) {
            crate::csr::validate(obj, current, causes);
        }
    }

    /// What the server keeps itself on a CRD (status, cleanup finalizer) and on an
    /// APIService (its availability).
    pub(super) fn prepare_server_owned(
        &self,
        res: &Resource,
        obj: &mut Value,
        current: Option<&Value>,
    ) {
        if is_crd(res) {
            crd::prepare(obj, current);
        } else if crate::apiservices::is_apiservice(res) {
            crate::apiservices::prepare(obj, current);
        } else if res.group.is_empty() && res.plural == "namespaces" {
            // Every namespace carries its name as a label, as in Kubernetes (webhooks and
            // network policies select namespaces by it); nobody may change it.
            let name = obj["metadata"]["name"].clone();
            if !obj["metadata"]["labels"].is_object() {
                obj["metadata"]["labels"] = json!({});
            }
            obj["metadata"]["labels"][NAMESPACE_NAME_LABEL] = name;
        }
    }
}

/// The label every namespace carries with its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Whether `res` is the CustomResourceDefinition kind itself.
pub(super) fn is_crd(res: &Resource) -> bool {
    res.group == crate::catalog::APIEXTENSIONS && res.kind == "CustomResourceDefinition"
}

/// An answer of a CRD that serves several versions, with `apiVersion` of the version asked
/// for on every object (objects keep the version they were written in).
pub(super) fn in_version(version: &Version, resp: ApiResponse) -> Result<ApiResponse, ApiError> {
    if version.served_versions < 2 {
        return Ok(resp);
    }
    let want = json!(api_version(version.resource));
    let fix = move |v: &mut Value| {
        if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
            for item in items {
                if item.get("apiVersion").is_some() {
                    item["apiVersion"] = want.clone();
                }
            }
        } else if v.get("metadata").is_some() && v.get("kind").is_some_and(|k| k != "Status") {
            v["apiVersion"] = want.clone();
        }
    };
    super::views::map_answer(resp, fix)
}
