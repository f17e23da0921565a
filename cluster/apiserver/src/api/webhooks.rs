//! Admission webhooks on the write path ([`crate::webhooks`]): which webhooks select a
//! request, calling them, applying mutating webhooks' patches and refusing what a
//! validating webhook denies.
//!
//! Where they run, as in kube-apiserver: after the server's own defaults and mutating
//! admission (LimitRanges, priorities, default tolerations and storage class), mutating
//! webhooks; then the object is decoded and validated again if they changed it; then the
//! validating checks (Pod Security, RBAC escalation) and validating webhooks; quotas last.

use std::time::Instant;

use super::*;
use crate::webhooks::{self, Attributes, Hook, Operation, Review, Snapshot, Target};

/// A request as webhooks see it.
pub(super) struct Admission<'a> {
    pub(super) snapshot: Arc<Snapshot>,
    pub(super) req: &'a ApiRequest,
    pub(super) user: &'a User,
    pub(super) operation: Operation,
    /// The namespace's labels, read when a selector first needs them (None inside: the
    /// namespace is not there).
    namespace_labels: Option<Option<Value>>,
}

/// The object a webhook sees for `req`: a Scale for the scale subresource, else the object.
pub(super) fn view(req: &ApiRequest, api: &Api, obj: &Value) -> Value {
    match req.subresource.as_deref() {
        Some("scale") => to_scale_plain(req.resource, api.scale_paths(req.resource).as_ref(), obj),
        _ => obj.clone(),
    }
}

impl Api {
    /// The webhooks that may judge `req` for `operation`, or None when none can (no
    /// configuration: the common case, one snapshot read).
    pub(super) async fn admission<'a>(
        &self,
        req: &'a ApiRequest,
        user: &'a User,
        operation: Operation,
    ) -> Result<Option<Admission<'a>>, ApiError> {
        if !webhooks::admits(req.resource)
            || matches!(req.subresource.as_deref(), Some("binding" | "eviction"))
        {
            return Ok(None);
        }
        let snapshot = self.webhooks.snapshot().await?;
        if snapshot.is_empty() {
            return Ok(None);
        }
        Ok(Some(Admission {
            snapshot,
            req,
            user,
            operation,
            namespace_labels: None,
        }))
    }

    pub(super) fn attributes<'a>(req: &'a ApiRequest, operation: Operation) -> Attributes<'a> {
        Attributes {
            operation,
            group: req.resource.group,
            version: req.resource.version,
            resource: req.resource.plural,
            subresource: req.subresource.as_deref(),
            namespaced: req.resource.namespaced,
        }
    }

    /// The webhooks of `hooks` that select the request (with the version each sees it in),
    /// by rules, object selector and namespace selector.
    async fn selected(
        &self,
        a: &mut Admission<'_>,
        mutating: bool,
        obj: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<Vec<(Arc<Hook>, String)>, ApiError> {
        let attrs = Api::attributes(a.req, a.operation);
        let served = self.crds.current();
        let snapshot = a.snapshot.clone();
        let hooks = if mutating {
            &snapshot.mutating
        } else {
            &snapshot.validating
        };
        let mut out = Vec::new();
        for hook in hooks.iter() {
            let Some(version) = hook.selects(&attrs, served.as_ref()) else {
                continue;
            };
            if !hook.selectors.object_matches(obj, old) {
                continue;
            }
            if !self
                .namespace_selected(a, &hook.selectors, obj, old)
                .await?
            {
                continue;
            }
            if !hook.conditions.is_empty() && !self.conditions_hold(a, hook, &version, obj, old)? {
                continue;
            }
            out.push((hook.clone(), version));
        }
        Ok(out)
    }

    /// Whether `selectors`' namespace selector selects the request's namespace (read when
    /// a selector first needs its labels; a Namespace is judged by its own labels).
    pub(super) async fn namespace_selected(
        &self,
        a: &mut Admission<'_>,
        selectors: &webhooks::Selectors,
        obj: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<bool, ApiError> {
        if !selectors.needs_namespace() {
            return Ok(true);
        }
        let is_namespace = a.req.resource.group.is_empty() && a.req.resource.plural == "namespaces";
        let labels = if is_namespace {
            obj.or(old).map(|o| o["metadata"]["labels"].clone())
        } else if let Some(ns) = a
            .req
            .namespace
            .as_deref()
            .filter(|_| a.req.resource.namespaced)
        {
            if a.namespace_labels.is_none() {
                let facts = self.namespace_facts(ns).await?;
                a.namespace_labels = Some(facts.map(|f| f.labels));
            }
            Some(a.namespace_labels.clone().flatten().unwrap_or(Value::Null))
        } else {
            None
        };
        Ok(selectors.namespace_matches(labels.as_ref()))
    }

    /// Whether `hook`'s match conditions hold for the request. One that fails to evaluate
    /// skips the webhook if it fails open, else refuses the request.
    fn conditions_hold(
        &self,
        a: &Admission<'_>,
        hook: &Hook,
        version: &str,
        obj: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<bool, ApiError> {
        use crate::cel::Binding;
        let object = obj.map(|o| view(a.req, self, o));
        let old_object = old.map(|o| view(a.req, self, o));
        let review = Api::review(a, object.as_ref());
        let request = review.body(version, None, None)["request"].take();
        let null = Value::Null;
        let bindings = [
            ("object", Binding::Json(object.as_ref().unwrap_or(&null))),
            (
                "oldObject",
                Binding::Json(old_object.as_ref().unwrap_or(&null)),
            ),
            ("request", Binding::Json(&request)),
        ];
        match webhooks::conditions_hold(&hook.conditions, &bindings) {
            Ok(holds) => Ok(holds),
            Err(why) if hook.fail_open => {
                tracing::warn!(webhook = %hook.name, error = %why, "admission webhook skipped (failurePolicy Ignore)");
                Ok(false)
            }
            Err(why) => Err(webhooks::failed(&hook.name, &why)),
        }
    }

    /// The AdmissionReview request for `a` (its uid fresh).
    pub(super) fn review<'a>(a: &'a Admission<'_>, obj: Option<&'a Value>) -> Review<'a> {
        let req = a.req;
        let (group, kind_version, kind) = match req.subresource.as_deref() {
            Some("scale") => ("autoscaling", "v1", "Scale"),
            _ if a.operation == Operation::Connect => {
                ("", "v1", crate::api::streams::options_kind(req))
            }
            _ => (req.resource.group, req.resource.version, req.resource.kind),
        };
        let name = req
            .name
            .as_deref()
            .or_else(|| obj.and_then(|o| o["metadata"]["name"].as_str()))
            .unwrap_or_default();
        Review {
            uid: super::uid(),
            attributes: Api::attributes(req, a.operation),
            kind: (group, kind_version, kind),
            name,
            namespace: req.namespace.as_deref().filter(|_| req.resource.namespaced),
            user: (a.user.name(), a.user.groups()),
            dry_run: req.params.dry_run,
            field_manager: req.params.field_manager.as_deref(),
        }
    }

    /// Runs the mutating webhooks that select the request on `obj` (`old`: the current
    /// object of an update). True if they changed it. A denial or a failed call of a
    /// webhook that fails closed refuses the request.
    pub(super) async fn mutate_by_webhooks(
        &self,
        a: &mut Admission<'_>,
        obj: &mut Value,
        old: Option<&Value>,
        warnings: &mut Vec<String>,
    ) -> Result<bool, ApiError> {
        // Selected by the whole objects' labels (a Scale's are its object's); copied into
        // what the webhooks see only when one selects the request.
        let object = (a.operation != Operation::Delete).then_some(&*obj);
        let selected = self.selected(a, true, object, old).await?;
        if selected.is_empty() {
            return Ok(false);
        }
        let old_view = old.map(|o| view(a.req, self, o));
        let mut current = view(a.req, self, obj);
        let before = current.clone();
        // Changes counted, and the count after each webhook's call: a webhook with
        // `reinvocationPolicy: IfNeeded` is called once more if a later one changed the
        // object after it.
        let mut changes = 0usize;
        let mut after = vec![0usize; selected.len()];
        for (i, (hook, version)) in selected.iter().enumerate() {
            if self
                .call_mutating(a, hook, version, &mut current, old_view.as_ref(), warnings)
                .await?
            {
                changes += 1;
            }
            after[i] = changes;
        }
        if changes > 0 {
            for (i, (hook, version)) in selected.iter().enumerate() {
                if hook.reinvoke && after[i] < changes {
                    self.call_mutating(a, hook, version, &mut current, old_view.as_ref(), warnings)
                        .await?;
                }
            }
        }
        if current == before {
            return Ok(false);
        }
        for key in ["name", "namespace"] {
            if current["metadata"][key] != before["metadata"][key] {
                return Err(ApiError::internal(format!(
                    "a mutating admission webhook changed metadata.{key}, which it may not"
                )));
            }
        }
        *obj = match a.req.subresource.as_deref() {
            Some("scale") => from_scale(self.scale_paths(a.req.resource).as_ref(), obj, &current)?,
            _ => current,
        };
        Ok(true)
    }

    /// One mutating call: its patch applied to `obj`; true if that changed it.
    async fn call_mutating(
        &self,
        a: &Admission<'_>,
        hook: &Hook,
        version: &str,
        obj: &mut Value,
        old: Option<&Value>,
        warnings: &mut Vec<String>,
    ) -> Result<bool, ApiError> {
        // A CRD with a conversion webhook: the webhook sees, and patches, the object
        // converted to its version; the patched object is converted back.
        let conversion = self.hook_conversion(a, version);
        let converted = match &conversion {
            Some((c, want)) if a.operation != Operation::Delete => {
                Some(self.convert_one(c, want, obj.clone()).await?)
            }
            _ => None,
        };
        let object =
            (a.operation != Operation::Delete).then_some(converted.as_ref().unwrap_or(obj));
        let Some(verdict) = self.call_webhook(a, hook, version, object, old).await? else {
            return Ok(false);
        };
        warnings.extend(verdict.warnings);
        let (Some(patch), Operation::Create | Operation::Update) = (verdict.patch, a.operation)
        else {
            return Ok(false);
        };
        let (api_version, kind) = (obj["apiVersion"].clone(), obj["kind"].clone());
        let mut patched = converted.unwrap_or_else(|| obj.clone());
        if conversion.is_none() && version != a.req.resource.version {
            let g = a.req.resource.group;
            patched["apiVersion"] = json!(if g.is_empty() {
                version.to_owned()
            } else {
                format!("{g}/{version}")
            });
        }
        crate::patch::json_patch(&mut patched, &patch).map_err(|e| {
            ApiError::internal(format!(
                "the patch of admission webhook {:?} could not be applied: {}",
                hook.name, e.0
            ))
        })?;
        match &conversion {
            Some((c, _)) => {
                let back = api_version.as_str().unwrap_or_default().to_owned();
                patched = self.convert_one(c, &back, patched).await?;
            }
            None => {
                patched["apiVersion"] = api_version;
                patched["kind"] = kind;
            }
        }
        if patched == *obj {
            return Ok(false);
        }
        *obj = patched;
        Ok(true)
    }

    /// Runs the validating webhooks that select the request, all at once: the first denial
    /// (in calling order) refuses it.
    pub(super) async fn validate_by_webhooks(
        &self,
        a: &mut Admission<'_>,
        obj: Option<&Value>,
        old: Option<&Value>,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        self.validate_by_policies(a, obj, old, warnings).await?;
        let selected = self.selected(a, false, obj, old).await?;
        if selected.is_empty() {
            return Ok(());
        }
        let obj_view = obj.map(|o| view(a.req, self, o));
        let old_view = old.map(|o| view(a.req, self, o));
        let a = &*a;
        let calls = selected.iter().map(|(hook, version)| {
            self.call_webhook(a, hook, version, obj_view.as_ref(), old_view.as_ref())
        });
        for verdict in futures::future::join_all(calls).await {
            if let Some(v) = verdict? {
                warnings.extend(v.warnings);
            }
        }
        Ok(())
    }

    /// Calls one webhook: its verdict if it allowed the request, None if it could not be
    /// called and fails open; an error if it denied the request or could not be called and
    /// fails closed.
    async fn call_webhook(
        &self,
        a: &Admission<'_>,
        hook: &Hook,
        version: &str,
        obj: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<Option<webhooks::Verdict>, ApiError> {
        let mut held = (None, None);
        if let Some((c, want)) = self.hook_conversion(a, version) {
            for (from, to) in [(obj, &mut held.0), (old, &mut held.1)] {
                if let Some(o) = from {
                    *to = Some(self.convert_one(&c, &want, o.clone()).await?);
                }
            }
        }
        let (obj, old) = (held.0.as_ref().or(obj), held.1.as_ref().or(old));
        let review = Api::review(a, obj);
        let body = review.body(version, obj, old).to_string().into_bytes();
        let ty = if hook.mutating { "admit" } else { "validating" };
        let started = Instant::now();
        let answer = tokio::time::timeout(hook.timeout, async {
            let target = self.webhook_target(&hook.endpoint, hook.timeout).await?;
            self.webhooks
                .caller
                .post(&target, hook.ca_pem.as_ref(), body)
                .await
        })
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "context deadline exceeded (the webhook's timeout is {}s)",
                hook.timeout.as_secs()
            ))
        })
        .and_then(|bytes| webhooks::verdict(&bytes, &review.uid, hook.mutating));
        let outcome = match &answer {
            Ok(v) if v.allowed => "allowed",
            Ok(_) => "denied",
            Err(_) if hook.fail_open => "ignored",
            Err(_) => "failed",
        };
        if let Some(m) = &self.metrics {
            m.webhook_calls
                .with_label_values(&[hook.name.as_str(), ty, a.operation.as_str(), outcome])
                .inc();
            m.webhook_duration
                .with_label_values(&[hook.name.as_str(), ty])
                .observe(started.elapsed().as_secs_f64());
        }
        match answer {
            Ok(v) if v.allowed => Ok(Some(v)),
            Ok(v) => Err(webhooks::denial(&hook.name, &v.status)),
            Err(why) if hook.fail_open => {
                tracing::warn!(webhook = %hook.name, error = %why, "admission webhook could not be called; ignored (failurePolicy Ignore)");
                Ok(None)
            }
            Err(why) => Err(webhooks::failed(&hook.name, &why)),
        }
    }

    /// The conversion a webhook that sees the request in `version` needs: the CRD's
    /// conversion webhook and the apiVersion to convert to, when the request is for a
    /// custom resource whose CRD has one and the admission webhook's rules name another of
    /// its versions (`matchPolicy: Equivalent`).
    fn hook_conversion(
        &self,
        a: &Admission<'_>,
        version: &str,
    ) -> Option<(std::sync::Arc<crate::crd::Conversion>, String)> {
        let res = a.req.resource;
        if version == res.version {
            return None;
        }
        let c = self.conversion(res)?;
        Some((c, format!("{}/{version}", res.group)))
    }

    /// Where a webhook served at `endpoint` is called: its URL's host, or a ready endpoint
    /// of its Service (the Service port's target port on an address of its Endpoints).
    pub(super) async fn webhook_target(
        &self,
        endpoint: &webhooks::Endpoint,
        timeout: std::time::Duration,
    ) -> Result<Target, String> {
        let (namespace, name, port, path) = match endpoint {
            webhooks::Endpoint::Url(uri) => return webhooks::url_target(uri, timeout).await,
            webhooks::Endpoint::Service {
                namespace,
                name,
                port,
                path,
            } => (namespace, name, *port, path),
        };
        let addr = self
            .service_address(namespace, name, port)
            .await
            .map_err(|t| t.message)?;
        let server_name = format!("{name}.{namespace}.svc");
        Ok(Target {
            addr,
            host: format!("{server_name}:{port}"),
            server_name,
            path: webhooks::with_timeout(path, timeout),
        })
    }

    /// Where Service `namespace/name`'s `port` is reached: the target port on the first
    /// address of its Endpoints that serves it (as kube-apiserver reaches webhooks and, with
    /// `--enable-aggregator-routing`, extension API servers).
    pub(crate) async fn service_address(
        &self,
        namespace: &str,
        name: &str,
        port: u16,
    ) -> Result<std::net::SocketAddr, ServiceTrouble> {
        let read = |plural: &'static str, reason: &'static str| async move {
            let trouble = |message: String| ServiceTrouble { reason, message };
            let res =
                crate::request::find_resource("", "v1", plural).map_err(|e| trouble(e.message))?;
            self.read(res, Some(namespace), name)
                .await
                .map_err(|e| trouble(e.message))?
                .map(|(v, _)| v)
                .ok_or_else(|| trouble(format!("service \"{namespace}/{name}\" has no {plural}")))
        };
        let service = read("services", "ServiceNotFound").await?;
        let service_port = service["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["port"].as_u64() == Some(u64::from(port)))
            .ok_or_else(|| ServiceTrouble {
                reason: "ServicePortError",
                message: format!("service \"{namespace}/{name}\" has no port {port}"),
            })?;
        let port_name = service_port["name"].as_str().unwrap_or_default();
        let target_port = &service_port["targetPort"];
        let endpoints = read("endpoints", "MissingEndpoints").await?;
        for subset in endpoints["subsets"].as_array().into_iter().flatten() {
            let found = subset["ports"].as_array().into_iter().flatten().find(|p| {
                p["name"].as_str().unwrap_or_default() == port_name
                    || target_port
                        .as_u64()
                        .is_some_and(|t| p["port"].as_u64() == Some(t))
            });
            let (Some(p), Some(ip)) = (
                found
                    .and_then(|p| p["port"].as_u64())
                    .and_then(|p| u16::try_from(p).ok()),
                subset["addresses"]
                    .as_array()
                    .and_then(|a| a.first())
                    .and_then(|a| a["ip"].as_str())
                    .and_then(|ip| ip.parse::<std::net::IpAddr>().ok()),
            ) else {
                continue;
            };
            return Ok(std::net::SocketAddr::new(ip, p));
        }
        Err(ServiceTrouble {
            reason: "MissingEndpoints",
            message: format!(
                "service \"{namespace}/{name}\" has no ready endpoint for port {port}"
            ),
        })
    }
}

/// Why a Service cannot be reached: Kubernetes' reason (`ServiceNotFound`,
/// `ServicePortError`, `MissingEndpoints`, as an APIService's condition names it) and what
/// is wrong.
#[derive(Debug)]
pub(crate) struct ServiceTrouble {
    /// The reason.
    pub reason: &'static str,
    /// The message.
    pub message: String,
}
