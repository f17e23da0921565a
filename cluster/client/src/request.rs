//! What one API request asks for, independent of HTTP: the verb, the resource it names, the
//! query parameters already parsed and checked, and the body. The HTTP server builds these
//! from URLs; in-process components build them directly.

use bytes::Bytes;
use serde_json::Value;
use tessera_core::selector::{field::FieldSelector, label::LabelSelector};

use crate::catalog::Resource;
use crate::status::ApiError;

/// Largest request body accepted (etcd's own limit on a value is 1.5 MiB).
pub const MAX_BODY_BYTES: usize = 3 << 20;

/// The verb of a request, as Kubernetes' authorization names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// Read one object.
    Get,
    /// Read a collection.
    List,
    /// Stream changes of a collection.
    Watch,
    /// Make a new object.
    Create,
    /// Replace an object.
    Update,
    /// Change part of an object.
    Patch(PatchType),
    /// Remove an object.
    Delete,
    /// Remove every object of a collection that matches the selectors.
    DeleteCollection,
}

impl Verb {
    /// The name used in metrics and messages (`get`, `list`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch(_) => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }

    /// True for verbs that change state.
    pub fn is_write(&self) -> bool {
        !matches!(self, Verb::Get | Verb::List | Verb::Watch)
    }
}

/// The four patch formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// RFC 6902 (`application/json-patch+json`).
    Json,
    /// RFC 7386 (`application/merge-patch+json`).
    Merge,
    /// Kubernetes' strategic merge patch (`application/strategic-merge-patch+json`).
    StrategicMerge,
    /// Server-side apply (`application/apply-patch+yaml`).
    Apply,
}

impl PatchType {
    /// The patch type a content type names.
    pub fn from_content_type(ct: &str) -> Option<PatchType> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::StrategicMerge),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// `fieldValidation`: what to do with fields the kind does not have.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them and warn (the default, as in Kubernetes).
    #[default]
    Warn,
    /// Refuse the request.
    Strict,
}

/// `propagationPolicy` of a delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    /// Dependents are left without an owner.
    Orphan,
    /// The object goes now; the garbage collector removes dependents afterwards.
    Background,
    /// Dependents go first; the object waits for them with the `foregroundDeletion` finalizer.
    Foreground,
}

/// Query parameters, parsed and checked.
#[derive(Clone, Debug, Default)]
pub struct Params {
    /// `labelSelector`.
    pub label_selector: Option<LabelSelector>,
    /// `fieldSelector`.
    pub field_selector: Option<FieldSelector>,
    /// `limit` (0: no limit).
    pub limit: usize,
    /// `continue`.
    pub continue_token: Option<String>,
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch` (`Exact`, `NotOlderThan`).
    pub resource_version_match: Option<String>,
    /// `allowWatchBookmarks`.
    pub allow_bookmarks: bool,
    /// `timeoutSeconds` of a watch.
    pub timeout_seconds: Option<u64>,
    /// `dryRun=All`.
    pub dry_run: bool,
    /// `fieldValidation`.
    pub field_validation: FieldValidation,
    /// `fieldManager`.
    pub field_manager: Option<String>,
    /// `force` (server-side apply).
    pub force: bool,
    /// `propagationPolicy`.
    pub propagation: Option<Propagation>,
    /// `gracePeriodSeconds`.
    pub grace_period_seconds: Option<i64>,
    /// `includeObject` of a Table (`None`, `Metadata`, `Object`).
    pub include_object: Option<String>,
    /// The options of a `pods/log` read.
    pub log: LogOptions,
}

/// What a `pods/log` read asks for (Kubernetes' `PodLogOptions`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// `container` (may be left out when the pod has one).
    pub container: Option<String>,
    /// `follow`: stream until the container stops.
    pub follow: bool,
    /// `previous`: the container's run before the current one.
    pub previous: bool,
    /// `tailLines`: only the last N lines.
    pub tail_lines: Option<i64>,
    /// `sinceSeconds`: only lines newer than this many seconds.
    pub since_seconds: Option<i64>,
    /// `sinceTime` (RFC 3339): only lines from this time on.
    pub since_time: Option<String>,
    /// `timestamps`: each line starts with its RFC 3339 time.
    pub timestamps: bool,
    /// `limitBytes`: stop after this many bytes.
    pub limit_bytes: Option<i64>,
}

impl LogOptions {
    /// What Kubernetes' `ValidatePodLogOptions` refuses, as one message.
    pub fn problems(&self) -> Option<String> {
        let mut out = Vec::new();
        if self.tail_lines.is_some_and(|n| n < 0) {
            out.push("tailLines: Invalid value: must be greater than or equal to 0");
        }
        if self.limit_bytes.is_some_and(|n| n < 1) {
            out.push("limitBytes: Invalid value: must be greater than 0");
        }
        if self.since_seconds.is_some() && self.since_time.is_some() {
            out.push("sinceSeconds: Forbidden: at most one of sinceTime or sinceSeconds may be specified");
        }
        if self.since_seconds.is_some_and(|n| n < 1) {
            out.push("sinceSeconds: Invalid value: must be greater than 0");
        }
        if self
            .since_time
            .as_deref()
            .is_some_and(|t| t.parse::<jiff::Timestamp>().is_err())
        {
            out.push("sinceTime: Invalid value: must be an RFC 3339 time");
        }
        (!out.is_empty()).then(|| out.join(", "))
    }

    /// The earliest line time asked for, in nanoseconds since the epoch, at `now_nanos`.
    pub fn since_nanos(&self, now_nanos: i128) -> Option<i128> {
        if let Some(s) = self.since_seconds {
            return Some(now_nanos - i128::from(s) * 1_000_000_000);
        }
        let t: jiff::Timestamp = self.since_time.as_deref()?.parse().ok()?;
        Some(t.as_nanosecond())
    }

    /// The options as a query string (without the container), for a node agent.
    pub fn to_query(&self) -> String {
        let mut q = Vec::new();
        if self.follow {
            q.push("follow=true".to_owned());
        }
        if self.previous {
            q.push("previous=true".to_owned());
        }
        if self.timestamps {
            q.push("timestamps=true".to_owned());
        }
        if let Some(n) = self.tail_lines {
            q.push(format!("tailLines={n}"));
        }
        if let Some(n) = self.since_seconds {
            q.push(format!("sinceSeconds={n}"));
        }
        if let Some(t) = &self.since_time {
            q.push(format!("sinceTime={}", t.replace('+', "%2B")));
        }
        if let Some(n) = self.limit_bytes {
            q.push(format!("limitBytes={n}"));
        }
        q.join("&")
    }
}

/// A request body handed over in the same process already decoded, so no JSON text is
/// written by the caller and parsed again by the API. Over HTTPS it is sent as JSON.
///
/// A body made with [`Decoded::typed`] was serialized from the kind's own Rust type, so it
/// has no unknown fields and every field has its type's shape: the API skips decoding it
/// into that type again (the check a body from outside the process needs). Only
/// [`Decoded::typed`] can mark a body so; one made with [`Decoded::value`] is checked as
/// JSON text is.
#[derive(Clone, Debug)]
pub struct Decoded {
    value: Value,
    /// `(apiVersion, kind)` of the type it was serialized from.
    typed: Option<(&'static str, &'static str)>,
}

impl Decoded {
    /// A body built as a value (by hand, or from a patch): checked as JSON text is.
    pub fn value(value: Value) -> Self {
        Decoded { value, typed: None }
    }

    /// An object serialized from its kind's own type.
    pub fn typed<T: k8s_openapi::Resource + serde::Serialize>(obj: &T) -> Result<Self, ApiError> {
        let value = serde_json::to_value(obj).map_err(|e| {
            ApiError::internal(format!("a {} could not be serialized: {e}", T::KIND))
        })?;
        Ok(Decoded {
            value,
            typed: Some((T::API_VERSION, T::KIND)),
        })
    }

    /// The body as a value.
    pub fn as_value(&self) -> &Value {
        &self.value
    }

    /// The body as a value, owned.
    pub fn into_value(self) -> Value {
        self.value
    }

    /// True if the body was serialized from the type of `group`/`version` `kind`.
    pub fn is_typed_as(&self, group: &str, version: &str, kind: &str) -> bool {
        self.typed.is_some_and(|(api_version, k)| {
            let (g, v) = api_version.split_once('/').unwrap_or(("", api_version));
            (g, v, k) == (group, version, kind)
        })
    }
}

/// One API request.
#[derive(Clone, Debug)]
pub struct ApiRequest {
    /// What to do.
    pub verb: Verb,
    /// Which resource.
    pub resource: &'static Resource,
    /// The namespace, for namespaced resources.
    pub namespace: Option<String>,
    /// The object's name (absent for collections).
    pub name: Option<String>,
    /// The subresource (`status`, `scale`, `binding`, `log`).
    pub subresource: Option<String>,
    /// Query parameters.
    pub params: Params,
    /// The body (JSON for writes, the patch for patches, DeleteOptions for deletes).
    pub body: Bytes,
    /// A create's, an update's or a binding's body handed over already decoded (in-process
    /// callers); when set, `body` is empty.
    pub object: Option<Decoded>,
    /// The answer should be a `meta.k8s.io/v1` Table (kubectl's `get`).
    pub table: bool,
}

impl ApiRequest {
    /// A request with default parameters and no body.
    pub fn new(verb: Verb, resource: &'static Resource) -> Self {
        ApiRequest {
            verb,
            resource,
            namespace: None,
            name: None,
            subresource: None,
            params: Params::default(),
            body: Bytes::new(),
            object: None,
            table: false,
        }
    }

    /// The body as a JSON value: the object handed over in-process, or the text parsed.
    pub fn body_value(&self) -> Result<Value, serde_json::Error> {
        match &self.object {
            Some(o) => Ok(o.as_value().clone()),
            None => serde_json::from_slice(&self.body),
        }
    }

    /// The body as JSON text: the text sent, or the object handed over serialized.
    pub fn body_bytes(&self) -> Bytes {
        match &self.object {
            Some(o) if self.body.is_empty() => Bytes::from(o.as_value().to_string()),
            _ => self.body.clone(),
        }
    }
}

/// The resource a group, version and plural name, or a NotFound saying what is served.
pub fn find_resource(
    group: &str,
    version: &str,
    plural: &str,
) -> Result<&'static Resource, ApiError> {
    crate::catalog::find(group, version, plural).ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                format!(
                    "the server could not find the requested resource ({plural} in {}); `kubectl api-resources` lists what is served",
                    if group.is_empty() {
                        version.to_owned()
                    } else {
                        format!("{group}/{version}")
                    }
                ),
            )
        })
}

/// Decodes `%XX` and `+` in a query component.
pub fn percent_decode(s: &str) -> Result<String, ApiError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("malformed percent-encoding in {s:?}"))
                    })?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
        .map_err(|_| ApiError::bad_request(format!("query value {s:?} is not UTF-8")))
}

/// Parses a query string into checked parameters.
pub fn parse_params(query: &str) -> Result<(Params, bool), ApiError> {
    let mut p = Params::default();
    let mut watch = false;
    for pair in query.split('&').filter(|s| !s.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v)?;
        let flag = |v: &str| -> Result<bool, ApiError> {
            match v {
                "" | "1" | "true" | "True" => Ok(true),
                "0" | "false" | "False" => Ok(false),
                other => Err(ApiError::bad_request(format!(
                    "query parameter {k}={other:?} must be true or false"
                ))),
            }
        };
        let number = |v: &str| -> Result<i64, ApiError> {
            v.parse::<i64>().map_err(|_| {
                ApiError::bad_request(format!("query parameter {k}={v:?} must be an integer"))
            })
        };
        match k {
            "labelSelector" if !v.is_empty() => {
                p.label_selector = Some(v.parse().map_err(|e| {
                    ApiError::bad_request(format!("unable to parse requirement: {e}"))
                })?)
            }
            "fieldSelector" if !v.is_empty() => {
                p.field_selector =
                    Some(v.parse().map_err(|e| {
                        ApiError::bad_request(format!("invalid field selector: {e}"))
                    })?)
            }
            "labelSelector" | "fieldSelector" => {}
            "limit" => {
                let n = number(&v)?;
                if n < 0 {
                    return Err(ApiError::bad_request("limit must not be negative"));
                }
                p.limit = n as usize;
            }
            "continue" if !v.is_empty() => p.continue_token = Some(v),
            "resourceVersion" if !v.is_empty() => p.resource_version = Some(v),
            "resourceVersionMatch" if !v.is_empty() => {
                if v != "Exact" && v != "NotOlderThan" {
                    return Err(ApiError::bad_request(format!(
                        "resourceVersionMatch {v:?} is not one of Exact, NotOlderThan"
                    )));
                }
                p.resource_version_match = Some(v)
            }
            "watch" => watch = flag(&v)?,
            "allowWatchBookmarks" => p.allow_bookmarks = flag(&v)?,
            "timeoutSeconds" => {
                let n = number(&v)?;
                p.timeout_seconds = Some(n.max(0) as u64);
            }
            "dryRun" => match v.as_str() {
                "All" => p.dry_run = true,
                "" => {}
                other => {
                    return Err(ApiError::bad_request(format!(
                        "dryRun {other:?} is not supported: the only value is All"
                    )));
                }
            },
            "fieldValidation" => {
                p.field_validation = match v.as_str() {
                    "Ignore" => FieldValidation::Ignore,
                    "Warn" | "" => FieldValidation::Warn,
                    "Strict" => FieldValidation::Strict,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "fieldValidation {other:?} is not one of Ignore, Warn, Strict"
                        )));
                    }
                }
            }
            "fieldManager" if !v.is_empty() => {
                if v.len() > 128 || v.chars().any(|c| c.is_control()) {
                    return Err(ApiError::bad_request(
                        "fieldManager must be at most 128 printable characters",
                    ));
                }
                p.field_manager = Some(v)
            }
            "force" => p.force = flag(&v)?,
            "propagationPolicy" if !v.is_empty() => p.propagation = Some(propagation(&v)?),
            "gracePeriodSeconds" => p.grace_period_seconds = Some(number(&v)?),
            "includeObject" => p.include_object = Some(v),
            "container" if !v.is_empty() => p.log.container = Some(v),
            "follow" => p.log.follow = flag(&v)?,
            "previous" => p.log.previous = flag(&v)?,
            "timestamps" => p.log.timestamps = flag(&v)?,
            "tailLines" => p.log.tail_lines = Some(number(&v)?),
            "sinceSeconds" => p.log.since_seconds = Some(number(&v)?),
            "sinceTime" if !v.is_empty() => p.log.since_time = Some(v),
            "limitBytes" => p.log.limit_bytes = Some(number(&v)?),
            // Accepted and ignored, as by Kubernetes: formatting and client hints.
            _ => {}
        }
    }
    Ok((p, watch))
}

/// Parses a `propagationPolicy` value.
pub fn propagation(v: &str) -> Result<Propagation, ApiError> {
    match v {
        "Orphan" => Ok(Propagation::Orphan),
        "Background" => Ok(Propagation::Background),
        "Foreground" => Ok(Propagation::Foreground),
        other => Err(ApiError::bad_request(format!(
            "propagationPolicy {other:?} is not one of Orphan, Background, Foreground"
        ))),
    }
}

/// Builds a request from an HTTP method, path and query. `Ok(None)` when the path is not an
/// object path (discovery and the like answer those).
pub fn from_http(
    method: &str,
    path: &str,
    query: &str,
    content_type: Option<&str>,
    accept: Option<&str>,
    body: Bytes,
) -> Result<Option<ApiRequest>, ApiError> {
    from_http_in(
        &crate::catalog::Builtin,
        method,
        path,
        query,
        content_type,
        accept,
        body,
    )
}

/// [`from_http`] with the resources `served` finds (an API server's CustomResourceDefinitions
/// beside the built-in catalog).
pub fn from_http_in(
    served: &dyn crate::catalog::Lookup,
    method: &str,
    path: &str,
    query: &str,
    content_type: Option<&str>,
    accept: Option<&str>,
    body: Bytes,
) -> Result<Option<ApiRequest>, ApiError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] if !rest.is_empty() => ("", *version, rest),
        ["apis", group, version, rest @ ..] if !rest.is_empty() => (*group, *version, rest),
        _ => return Ok(None),
    };
    if rest.iter().any(|s| s.is_empty()) {
        return Err(ApiError::new(
            404,
            "NotFound",
            format!("the path {path} has an empty segment"),
        ));
    }
    // (namespace, plural, name, subresource)
    let namespaced_plural = |p: &str| served.namespaced(group, p);
    let (ns, plural, name, sub) = match rest {
        [plural] => (None, *plural, None, None),
        // `namespaces/<name>/status` and `/finalize` are a Namespace's own subresources;
        // anything else there is a namespaced collection, served or not.
        ["namespaces", ns, plural]
            if namespaced_plural(plural)
                || !(group.is_empty() && ["status", "finalize"].contains(plural)) =>
        {
            (Some(*ns), *plural, None, None)
        }
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name), None),
        ["namespaces", ns, plural, name, sub] => (Some(*ns), *plural, Some(*name), Some(*sub)),
        [plural, name] => (None, *plural, Some(*name), None),
        [plural, name, sub] => (None, *plural, Some(*name), Some(*sub)),
        _ => {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("the server could not find the requested resource: {path}"),
            ));
        }
    };
    let resource = match served.find(group, version, plural) {
        Some(r) => r,
        None => find_resource(group, version, plural)?,
    };
    if resource.namespaced && ns.is_none() && name.is_some() {
        return Err(ApiError::bad_request(format!(
            "{plural} are namespaced: use /namespaces/<namespace>/{plural}/<name>"
        )));
    }
    if !resource.namespaced && ns.is_some() {
        return Err(ApiError::new(
            404,
            "NotFound",
            format!("{plural} are cluster-scoped: use the path without /namespaces/<namespace>"),
        ));
    }
    if let Some(s) = sub
        && !resource.subresources.iter().any(|r| r.name == s)
    {
        return Err(ApiError::new(
            404,
            "NotFound",
            format!("{plural} have no subresource {s:?}"),
        ));
    }
    let (params, watch) = parse_params(query)?;
    let verb = match (method, name.is_some()) {
        ("GET", true) => Verb::Get,
        ("GET", false) if watch => Verb::Watch,
        ("GET", false) => Verb::List,
        ("POST", false) => Verb::Create,
        ("POST", true) if matches!(sub, Some("binding" | "eviction" | "token")) => Verb::Create,
        ("PUT", true) => Verb::Update,
        ("PATCH", true) => {
            let ct = content_type.unwrap_or("");
            Verb::Patch(PatchType::from_content_type(ct).ok_or_else(|| {
                ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "the body of the request was in an unknown format ({ct:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
                    ),
                )
            })?)
        }
        ("DELETE", true) => Verb::Delete,
        ("DELETE", false) => Verb::DeleteCollection,
        (m, _) => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("{m} is not supported on {path}"),
            ));
        }
    };
    if matches!(verb, Verb::Create | Verb::Update) {
        let ct = content_type.unwrap_or("application/json");
        let base = ct.split(';').next().unwrap_or("").trim();
        if !(base == "application/json" || base == "application/yaml" || base.is_empty()) {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format ({ct:?}) - accepted media types include: application/json"
                ),
            ));
        }
    }
    if body.len() > MAX_BODY_BYTES {
        return Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!(
                "the request body is {} bytes; the limit is {MAX_BODY_BYTES}",
                body.len()
            ),
        ));
    }
    let table = accept.is_some_and(|a| {
        a.split(',').next().is_some_and(|first| {
            first.contains("as=Table") && first.contains("g=meta.k8s.io") && first.contains("v=v1")
        })
    });
    Ok(Some(ApiRequest {
        verb,
        resource,
        namespace: ns.map(str::to_owned),
        name: name.map(str::to_owned),
        subresource: sub.map(str::to_owned),
        params,
        body,
        object: None,
        table,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, path: &str, query: &str) -> Result<Option<ApiRequest>, ApiError> {
        from_http(method, path, query, None, None, Bytes::new())
    }

    #[test]
    fn paths_name_resources() {
        let r = req("GET", "/api/v1/namespaces/a/pods/p/status", "")
            .expect("ok")
            .expect("object path");
        assert_eq!(r.verb, Verb::Get);
        assert_eq!(
            (r.namespace.as_deref(), r.name.as_deref()),
            (Some("a"), Some("p"))
        );
        assert_eq!(r.subresource.as_deref(), Some("status"));
        let r = req("GET", "/api/v1/namespaces/a", "")
            .expect("ok")
            .expect("path");
        assert_eq!(
            (r.resource.plural, r.name.as_deref()),
            ("namespaces", Some("a"))
        );
        let r = req("GET", "/api/v1/namespaces/a/status", "")
            .expect("ok")
            .expect("path");
        assert_eq!(r.subresource.as_deref(), Some("status"));
        let r = req("GET", "/apis/apps/v1/deployments", "watch=true")
            .expect("ok")
            .expect("path");
        assert_eq!(r.verb, Verb::Watch);
        assert!(req("GET", "/version", "").expect("ok").is_none());
        let err = req("GET", "/api/v1/namespaces/a/nosuch", "").expect_err("unknown");
        assert!(err.message.contains("(nosuch in v1)"), "{}", err.message);
    }

    #[test]
    fn bad_requests_are_4xx_with_reasons() {
        for (method, path, query, code) in [
            ("GET", "/api/v1/nosuch", "", 404),
            ("GET", "/api/v1/pods/p", "", 400),
            ("GET", "/api/v1/namespaces/a/nodes/n", "", 404),
            ("GET", "/api/v1/namespaces/a/pods/p/nosuch", "", 404),
            ("GET", "/api/v1/pods", "labelSelector=a%3D%3D%3Db", 400),
            ("GET", "/api/v1/pods", "limit=-1", 400),
            ("GET", "/api/v1/pods", "limit=x", 400),
            ("GET", "/api/v1/pods", "fieldValidation=Loud", 400),
            ("GET", "/api/v1/pods", "dryRun=Some", 400),
            ("GET", "/api/v1/pods", "labelSelector=%ZZ", 400),
            ("POST", "/api/v1/namespaces/a/pods/p", "", 405),
            ("PATCH", "/api/v1/namespaces/a/pods/p", "", 415),
            ("GET", "/api/v1/namespaces//pods", "", 404),
            ("GET", "/apis/example.com/v1/namespaces/a/widgets", "", 404),
            ("GET", "/api/v1/namespaces/a/nosuch", "", 404),
        ] {
            let err = req(method, path, query).expect_err(path);
            assert_eq!(err.code, code, "{method} {path}?{query}: {}", err.message);
        }
    }

    #[test]
    fn selectors_are_percent_decoded() {
        let r = req(
            "GET",
            "/api/v1/pods",
            "labelSelector=app%3Dweb%2Ctier+in+%28a%2Cb%29",
        )
        .expect("ok")
        .expect("path");
        assert_eq!(
            r.params.label_selector.expect("selector").to_string(),
            "app=web,tier in (a,b)"
        );
    }
}
