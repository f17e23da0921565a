//! Writes: decoding bodies into the kinds' types, create, update, patch, the scale and
//! binding subresources, and the compare-and-swap loop they share.

use super::*;

pub(super) fn strip_meta_status(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("metadata");
        o.remove("status");
    }
    v
}

/// The (group, version, kind) a request body must be: the resource's kind, or the
/// subresource's (`Scale`, `Binding`).
pub(super) fn target_kind(req: &ApiRequest) -> (&'static str, &'static str, &'static str) {
    match req.subresource.as_deref() {
        Some("scale") => ("autoscaling", "v1", "Scale"),
        _ => (req.resource.group, req.resource.version, req.resource.kind),
    }
}

pub(super) fn target_schema(req: &ApiRequest) -> String {
    let (g, _, k) = target_kind(req);
    kinds::of_kind(g, k).map_or_else(String::new, |t| (t.schema_name)())
}

/// What `fieldValidation` makes of the unknown fields of a body: a refusal (Strict),
/// warnings (Warn) or nothing (Ignore).
pub(super) fn unknown_field_warnings(
    req: &ApiRequest,
    unknown: &[String],
) -> Result<Vec<String>, ApiError> {
    if unknown.is_empty() {
        return Ok(Vec::new());
    }
    let each = unknown.iter().map(|f| format!("unknown field \"{f}\""));
    match req.params.field_validation {
        FieldValidation::Strict => Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            each.collect::<Vec<_>>().join(", ")
        ))),
        FieldValidation::Warn => Ok(each.collect()),
        FieldValidation::Ignore => Ok(Vec::new()),
    }
}

/// True if `next` equals `current` outside `status` and `metadata.resourceVersion`.
fn only_status_differs(current: &Value, next: &Value) -> bool {
    fn same_except(a: &Value, b: &Value, skip: &[&str]) -> bool {
        let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
            return a == b;
        };
        let kept = |m: &serde_json::Map<String, Value>| {
            m.keys().filter(|k| !skip.contains(&k.as_str())).count()
        };
        kept(a) == kept(b)
            && a.iter()
                .filter(|(k, _)| !skip.contains(&k.as_str()))
                .all(|(k, v)| b.get(k) == Some(v))
    }
    current.is_object()
        && same_except(current, next, &["status", "metadata"])
        && same_except(
            &current["metadata"],
            &next["metadata"],
            &["resourceVersion"],
        )
}

impl Api {
    /// Decodes a create/update body: JSON object of the resource's kind, typed, with unknown
    /// fields handled per `fieldValidation`. Returns the object and warnings.
    ///
    /// `object` is the body handed over decoded by an in-process caller. One serialized
    /// from the target kind's own type ([`Decoded::typed`]) already has that type's shape,
    /// so only the server's defaults are applied to it; any other is checked as text is.
    pub(super) fn decode_body(
        &self,
        req: &ApiRequest,
        object: Option<Decoded>,
    ) -> Result<(Value, Vec<String>), ApiError> {
        let obj = match object {
            Some(o) => {
                let (group, version, kind) = target_kind(req);
                if o.is_typed_as(group, version, kind) {
                    return Ok((self.defaulted(req, o.into_value()), Vec::new()));
                }
                o.into_value()
            }
            None => serde_json::from_slice(&req.body).map_err(|e| {
                ApiError::bad_request(format!(
                    "the request body is not valid JSON: {e}; send one {} object",
                    req.resource.kind
                ))
            })?,
        };
        self.typed(req, obj)
    }

    /// [`Api::typed`] for a patch of the `status` subresource, of which only the status is
    /// kept (the rest of the object stays as stored, already typed). When the patch
    /// changed nothing outside the status (its `metadata.resourceVersion` aside), the
    /// status alone is decoded into the kind's type, in an object that has nothing else.
    /// Otherwise — or if that object does not decode (a kind whose type requires more than
    /// a status) — the whole object is decoded, as for any patch, so a wrong type anywhere
    /// in the patch is still refused as Kubernetes refuses it.
    fn typed_status(
        &self,
        req: &ApiRequest,
        current: &Value,
        mut obj: Value,
    ) -> Result<(Value, Vec<String>), ApiError> {
        if !only_status_differs(current, &obj) {
            return self.typed(req, obj);
        }
        let status = obj["status"].take();
        let mut part = json!({"metadata": {}});
        part["apiVersion"] = obj["apiVersion"].clone();
        part["kind"] = obj["kind"].clone();
        part["status"] = status.clone();
        match self.typed(req, part) {
            Ok((mut part, warnings)) => {
                obj["status"] = part["status"].take();
                Ok((obj, warnings))
            }
            Err(_) => {
                obj["status"] = status;
                self.typed(req, obj)
            }
        }
    }

    /// The server's defaults on an object already of its kind's type.
    fn defaulted(&self, req: &ApiRequest, mut obj: Value) -> Value {
        let (_, _, kind) = target_kind(req);
        if kind == req.resource.kind {
            crate::defaults::apply(req.resource, &mut obj);
            if obj["spec"].is_null()
                && let Some(o) = obj.as_object_mut()
            {
                o.remove("spec");
            }
        }
        obj
    }

    /// Checks apiVersion/kind (filling them in), decodes into the kind's type and applies
    /// `fieldValidation`.
    pub(super) fn typed(
        &self,
        req: &ApiRequest,
        mut obj: Value,
    ) -> Result<(Value, Vec<String>), ApiError> {
        let res = target_kind(req);
        if !obj.is_object() {
            return Err(ApiError::bad_request(format!(
                "the request body must be a JSON object (a {})",
                res.2
            )));
        }
        let want_version = if res.0.is_empty() {
            res.1.to_owned()
        } else {
            format!("{}/{}", res.0, res.1)
        };
        match obj.get("apiVersion") {
            None | Some(Value::Null) => obj["apiVersion"] = json!(want_version),
            Some(Value::String(v)) if *v == want_version => {}
            Some(v) => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({}) does not match the expected API version ({want_version})",
                    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
                )));
            }
        }
        match obj.get("kind") {
            None | Some(Value::Null) => obj["kind"] = json!(res.2),
            Some(Value::String(k)) if k == res.2 => {}
            Some(k) => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({}) does not match the expected kind ({})",
                    k.as_str().map_or_else(|| k.to_string(), str::to_owned),
                    res.2
                )));
            }
        }
        if req.resource.custom && res.2 == req.resource.kind {
            let version = self
                .custom(req.resource)
                .ok_or_else(|| ApiError::not_found(req.resource.group, req.resource.plural, ""))?;
            return self.typed_custom(req, &version, obj);
        }
        let typed = kinds::of_kind(res.0, res.2)
            .ok_or_else(|| ApiError::internal(format!("no type for {}", res.2)))?;
        // Unknown fields first, as Kubernetes' strict decoder reports them: a misspelt
        // field is usually why a required one looks missing.
        // (Under Ignore nothing is done with them, so they are not looked for.)
        let unknown = match req.params.field_validation {
            FieldValidation::Ignore => Vec::new(),
            _ => kinds::unknown_fields(res.0, res.2, &obj),
        };
        let warnings = unknown_field_warnings(req, &unknown)?;
        let normalized = (typed.normalize)(&obj).map_err(|e| {
            ApiError::bad_request(format!(
                "{kind} in version \"{v}\" cannot be handled as a {kind}: {path}{msg}",
                kind = res.2,
                v = res.1,
                path = if e.path.is_empty() {
                    String::new()
                } else {
                    format!("{}: ", e.path)
                },
                msg = e.message
            ))
        })?;
        Ok((self.defaulted(req, normalized), warnings))
    }

    /// Fills in what the server owns on a new object and validates it.
    pub(super) async fn prepare_new(
        &self,
        req: &ApiRequest,
        user: &User,
        mut obj: Value,
        applied: Option<Value>,
    ) -> Result<Value, ApiError> {
        let res = req.resource;
        if !obj["metadata"].is_object() {
            obj["metadata"] = json!({});
        }
        let meta = &mut obj["metadata"];
        let name = match (
            meta.get("name").and_then(Value::as_str),
            meta.get("generateName").and_then(Value::as_str),
        ) {
            (Some(n), _) if !n.is_empty() => n.to_owned(),
            (_, Some(prefix)) if !prefix.is_empty() => {
                let suffix: String = (0..5)
                    .map(|_| {
                        let alphabet = b"bcdfghjklmnpqrstvwxz2456789";
                        alphabet[rand::random_range(0..alphabet.len())] as char
                    })
                    .collect();
                format!("{prefix}{suffix}")
            }
            _ => {
                return Err(ApiError::invalid(
                    res.group,
                    res.kind,
                    "",
                    vec![Cause {
                        reason: "FieldValueRequired",
                        field: "metadata.name".into(),
                        message: "Required value: name or generateName is required".into(),
                    }],
                ));
            }
        };
        if let (Some(path_ns), Some(body_ns)) = (
            req.namespace.as_deref(),
            meta.get("namespace").and_then(Value::as_str),
        ) && path_ns != body_ns
            && !body_ns.is_empty()
        {
            return Err(ApiError::bad_request(format!(
                "the namespace of the provided object ({body_ns}) does not match the namespace sent on the request ({path_ns})"
            )));
        }
        let m = meta
            .as_object_mut()
            .ok_or_else(|| ApiError::internal("metadata"))?;
        match req.namespace.as_deref() {
            Some(n) => {
                m.insert("namespace".into(), json!(n));
            }
            None => {
                m.remove("namespace");
            }
        }
        m.insert("name".into(), json!(name));
        m.insert("uid".into(), json!(uid()));
        m.insert("creationTimestamp".into(), json!(rfc3339(now_secs())));
        m.insert("generation".into(), json!(1));
        for server_owned in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            m.remove(server_owned);
        }
        if res.plural == "pods" && obj["spec"]["schedulerName"].is_null() {
            obj["spec"]["schedulerName"] = json!("default-scheduler");
        }
        let manager = req
            .params
            .field_manager
            .clone()
            .unwrap_or_else(|| user.manager());
        match applied {
            Some(managed) => obj["metadata"]["managedFields"] = managed,
            None => apply::record_update(&mut obj, None, &manager, &api_version(res), "Update"),
        }
        // What the registry fills in on create comes after managedFields, as in
        // kube-apiserver (its field manager runs before the strategy's PrepareForCreate): a
        // new pod's Pending phase and QoS class, and a new namespace's phase and finalizer,
        // are owned by no manager — the kubelet's first status write then owns the status
        // alone, and the namespace controller removes the finalizer as nobody's field.
        if res.plural == "namespaces" {
            obj["status"] = json!({"phase": "Active"});
            if obj["spec"]["finalizers"].is_null() {
                obj["spec"]["finalizers"] = json!(["kubernetes"]);
            }
        }
        if res.plural == "pods" && obj["status"]["phase"].is_null() {
            obj["status"] = json!({"phase": "Pending", "qosClass": qos_class(&obj)});
        }
        if crate::csr::is_csr(res) {
            crate::csr::requested_by(&mut obj, user);
        }
        self.prepare_server_owned(res, &mut obj, None);
        let mut errors = validation::validate(res, &obj);
        self.validate_more(res, &obj, None, &mut errors.0);
        if !errors.is_empty() {
            return Err(ApiError::invalid(res.group, res.kind, &name, errors.0));
        }
        self.check_tenant_namespaces(res, &obj).await?;
        self.check_placement_shards(res, &obj).await?;
        Ok(obj)
    }

    /// An object a mutating webhook changed, decoded into its kind's type again (fields the
    /// type does not have dropped, as Kubernetes drops them from patched objects).
    fn retyped(&self, req: &ApiRequest, obj: Value) -> Result<Value, ApiError> {
        let mut lenient = req.clone();
        lenient.params.field_validation = FieldValidation::Ignore;
        Ok(self.typed(&lenient, obj)?.0)
    }

    /// A new object a mutating webhook changed: decoded and validated again, as a new one
    /// is.
    fn admitted_again(&self, req: &ApiRequest, obj: Value) -> Result<Value, ApiError> {
        let res = req.resource;
        let obj = self.retyped(req, obj)?;
        let mut errors = validation::validate(res, &obj);
        self.validate_more(res, &obj, None, &mut errors.0);
        if !errors.is_empty() {
            return Err(ApiError::invalid(
                res.group,
                res.kind,
                name_of(&obj),
                errors.0,
            ));
        }
        Ok(obj)
    }

    /// A Tenant's namespaces are its own: one another Tenant already lists is refused (a
    /// token of either would reach the other's objects there).
    async fn check_tenant_namespaces(&self, res: &Resource, obj: &Value) -> Result<(), ApiError> {
        if (res.group, res.kind) != ("tessera.io", "Tenant") {
            return Ok(());
        }
        let wanted = obj["spec"]["namespaces"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        if wanted.is_empty() {
            return Ok(());
        }
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let mut causes = Vec::new();
        for other in self.tenants().await? {
            let other_name = other["metadata"]["name"].as_str().unwrap_or_default();
            if other_name == name {
                continue;
            }
            for (i, ns) in wanted.iter().enumerate() {
                let owned = other["spec"]["namespaces"]
                    .as_array()
                    .is_some_and(|a| a.contains(ns));
                if owned {
                    causes.push(Cause {
                        reason: "FieldValueInvalid",
                        field: format!("spec.namespaces[{i}]"),
                        message: format!(
                            "Invalid value: {ns}: already owned by tenant {other_name:?}; remove it there first"
                        ),
                    });
                }
            }
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(res.group, res.kind, name, causes))
        }
    }

    /// A tenant may not label a namespace of its own with a Pod Security level looser than
    /// its Tenant allows (it would not take effect anyway: the stricter one is enforced),
    /// nor set, change or remove a label an admission webhook selects namespaces by (it
    /// would take its namespace out of the webhook's reach, or into another's).
    async fn check_namespace_labels(
        &self,
        res: &Resource,
        user: &User,
        obj: &Value,
        current: Option<&Value>,
    ) -> Result<(), ApiError> {
        use super::pod_security::{Level, TENANT_DEFAULT, looser_label};
        if res.plural != "namespaces" || !res.group.is_empty() || !user.is_tenant_side() {
            return Ok(());
        }
        let name = name_of(obj);
        let labels = &obj["metadata"]["labels"];
        let before = current.map_or(&Value::Null, |c| &c["metadata"]["labels"]);
        let webhooks = self.webhooks.snapshot().await?;
        // Every namespace selector in force: webhooks', and policies' and their bindings'.
        let hooks = webhooks
            .mutating
            .iter()
            .chain(&webhooks.validating)
            .map(|h| (format!("admission webhook {:?}", h.name), &h.selectors));
        let policies = webhooks.policies.iter().flat_map(|b| {
            b.selectors().map(|s| {
                (
                    format!(
                        "ValidatingAdmissionPolicy {:?} (binding {:?})",
                        b.policy.name, b.binding.name
                    ),
                    s,
                )
            })
        });
        for (who, selectors) in hooks.chain(policies) {
            if let Some(key) = selectors
                .namespace_label_keys()
                .filter(|k| *k != super::custom::NAMESPACE_NAME_LABEL)
                .find(|k| labels.get(*k) != before.get(*k))
            {
                return Err(ApiError::forbidden(format!(
                    "namespaces {name:?} is forbidden: {who} selects namespaces by label {key}, so only a cluster admin may set, change or remove it"
                )));
            }
        }
        let Some(tenant) = self.tenant_of(name).await? else {
            return Ok(());
        };
        let max = tenant["spec"]["podSecurity"]
            .as_str()
            .and_then(Level::parse)
            .unwrap_or(TENANT_DEFAULT);
        match looser_label(&obj["metadata"]["labels"], max) {
            Some((key, value)) => Err(ApiError::forbidden(format!(
                "namespaces {name:?} is forbidden: label {key}={value} is looser than tenant {:?} allows ({}); use {} or stricter",
                name_of(&tenant),
                max.as_str(),
                max.as_str()
            ))),
            None => Ok(()),
        }
    }

    /// Checks the namespace of a new object exists and is not being deleted; its labels
    /// (for Pod Security admission, which then needs no second read).
    pub(super) async fn check_namespace(&self, ns: &str) -> Result<Value, ApiError> {
        let Some(facts) = self.namespace_facts(ns).await? else {
            return Err(ApiError::not_found("", "namespaces", ns));
        };
        if facts.terminating {
            return Err(ApiError::forbidden(format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            )));
        }
        Ok(facts.labels)
    }

    /// What writes need of namespace `ns` (None if it does not exist).
    pub(super) async fn namespace_facts(
        &self,
        ns: &str,
    ) -> Result<Option<NamespaceFacts>, ApiError> {
        let ns_res = crate::request::find_resource("", "v1", "namespaces")?;
        // Read at every create (it may have just gone), decoded only when it changed.
        let Some(kv) = self
            .store
            .get(object_key(ns_res, None, ns).as_bytes())
            .await
            .map_err(store_error)?
        else {
            self.namespaces.lock().remove(ns);
            return Ok(None);
        };
        let known = self
            .namespaces
            .lock()
            .get(ns)
            .filter(|f| f.revision == kv.mod_revision)
            .cloned();
        if let Some(f) = known {
            return Ok(Some(f));
        }
        let mut n = decode_stored(&kv)?;
        let f = NamespaceFacts {
            revision: kv.mod_revision,
            terminating: n["metadata"]["deletionTimestamp"].is_string(),
            labels: n["metadata"]["labels"].take(),
        };
        let mut known = self.namespaces.lock();
        if known.len() >= NAMESPACES_REMEMBERED {
            known.clear();
        }
        known.insert(ns.to_owned(), f.clone());
        Ok(Some(f))
    }

    pub(super) async fn create(
        &self,
        req: &ApiRequest,
        user: &User,
        object: Option<Decoded>,
    ) -> Result<ApiResponse, ApiError> {
        let (obj, warnings) = self.decode_body(req, object)?;
        self.create_object(req, user, obj, warnings, None).await
    }

    /// Creates for server-side apply, when the object does not exist yet: `obj` is the
    /// configuration, `managed` its managedFields (all the applier's).
    pub(crate) async fn create_applied(
        &self,
        req: &ApiRequest,
        user: &User,
        obj: Value,
        managed: Value,
    ) -> Result<ApiResponse, ApiError> {
        let (obj, warnings) = self.typed(req, obj)?;
        self.create_object(req, user, obj, warnings, Some(managed))
            .await
    }

    pub(super) async fn create_object(
        &self,
        req: &ApiRequest,
        user: &User,
        obj: Value,
        mut warnings: Vec<String>,
        applied: Option<Value>,
    ) -> Result<ApiResponse, ApiError> {
        let mut obj = self.prepare_new(req, user, obj, applied).await?;
        let res = req.resource;
        let labels = match req.namespace.as_deref() {
            Some(ns) => Some(self.check_namespace(ns).await?),
            None => None,
        };
        // Mutating admission: the server's own, then webhooks.
        if res.plural == "persistentvolumeclaims" && res.group.is_empty() {
            self.default_storage_class(&mut obj).await?;
        }
        if res.plural == "pods" && res.group.is_empty() {
            self.apply_limit_ranges(req, &mut obj).await?;
            self.apply_priority(&mut obj).await?;
            self.default_tolerations.apply(&mut obj);
        }
        let mut admission = self
            .admission(req, user, crate::webhooks::Operation::Create)
            .await?;
        if let Some(a) = admission.as_mut()
            && self
                .mutate_by_webhooks(a, &mut obj, None, &mut warnings)
                .await?
        {
            obj = self.admitted_again(req, obj)?;
        }
        // Validating admission: the server's own, then webhooks.
        if let (Some(ns), Some(labels)) = (req.namespace.as_deref(), labels.as_ref()) {
            self.admit_pod_security(res, ns, Some(labels), &obj, &mut warnings)
                .await?;
        }
        self.check_namespace_labels(res, user, &obj, None).await?;
        self.check_rbac_write(res, user, &obj, None).await?;
        if crate::csr::is_csr(res) {
            crate::csr::restrict_subject(&obj)?;
        }
        if let Some(a) = admission.as_mut() {
            self.validate_by_webhooks(a, Some(&obj), None, &mut warnings)
                .await?;
        }
        if res.plural == "resourcequotas"
            && let Some(ns) = req.namespace.as_deref()
        {
            let used = self
                .usage_in(ns, &quantity_map(&obj["spec"]["hard"]), &obj["spec"])
                .await?;
            obj["status"] = json!({"hard": obj["spec"]["hard"], "used": quantity_json(&used)});
        }
        let name = name_of(&obj).to_owned();
        let is_service = res.plural == "services" && res.group.is_empty();
        // A CRD with a conversion webhook: stored in its storage version (a dry run is
        // answered in the request's, unconverted, as Kubernetes answers it).
        if !req.params.dry_run
            && let Some(c) = self.conversion(res)
        {
            obj = self.convert_one(&c, &c.storage, obj).await?;
        }
        if req.params.dry_run {
            if let Some(ns) = req.namespace.as_deref()
                && res.namespaced
            {
                let stored = self.stored_len(ns, &obj).await?;
                self.tenant_quota(ns, res, &obj, true, true, stored).await?;
            }
            if is_service {
                self.allocate(&mut obj, true).await?;
            }
            return Ok(ApiResponse::Object {
                code: 201,
                body: obj,
                warnings,
            });
        }
        // A Service's addresses are taken first, and given back if the create fails (a
        // Service that exists already is refused before anything is taken).
        if is_service
            && self
                .store
                .get(object_key(res, req.namespace.as_deref(), &name).as_bytes())
                .await
                .map_err(store_error)?
                .is_some()
        {
            return Err(ApiError::already_exists(res.group, res.plural, &name));
        }
        let held = if is_service {
            Some(self.allocate(&mut obj, false).await?)
        } else {
            None
        };
        // Then the object is charged to its tenant's quota (a pod's resources, anything's
        // count, its stored bytes as the store will hold them), and refunded if the create
        // fails.
        let charged = match req.namespace.as_deref() {
            Some(ns) if res.namespaced => match self.stored_len(ns, &obj).await {
                Ok(stored) => self
                    .tenant_quota(ns, res, &obj, true, false, stored)
                    .await
                    .map(|c| (c, stored)),
                Err(e) => Err(e),
            },
            _ => Ok((false, None)),
        };
        let (tenant_charged, stored) = match charged {
            Ok(c) => c,
            Err(e) => {
                if let Some(held) = held {
                    self.release(held).await;
                }
                return Err(e);
            }
        };
        let (e, obj) = match self.commit_create(req, obj, &name, warnings).await {
            Ok(created) => return Ok(created),
            Err(failed) => failed,
        };
        if let Some(held) = held {
            self.release(held).await;
        }
        if tenant_charged
            && let Some(ns) = req.namespace.as_deref()
            && let Err(e) = self.tenant_quota(ns, res, &obj, false, false, stored).await
        {
            tracing::warn!(error = %e, pod = %name, "could not refund a tenant quota reservation; the quota controller will");
        }
        Err(e)
    }

    /// The stored bytes `obj` is charged ([`crate::quota::charged_len`]), if the quota of
    /// the tenant owning `ns` limits them (measured only then).
    async fn stored_len(&self, ns: &str, obj: &Value) -> Result<Option<usize>, ApiError> {
        Ok(if self.tenant_counts_bytes(ns).await? {
            Some(crate::quota::charged_len(obj))
        } else {
            None
        })
    }

    /// Writes a new object, with its ResourceQuota charges in the same transaction. The
    /// object becomes the answer's body (not copied); a create that fails hands it back with
    /// the error, for what was reserved for it to be given back.
    pub(super) async fn commit_create(
        &self,
        req: &ApiRequest,
        obj: Value,
        name: &str,
        warnings: Vec<String>,
    ) -> Result<ApiResponse, (ApiError, Value)> {
        match self.commit_create_at(req, &obj, name).await {
            Ok(rev) => {
                self.wrote(req.resource);
                let key = object_key(req.resource, req.namespace.as_deref(), name);
                self.committed(req.resource, key.as_bytes(), Some(&obj), rev);
                Ok(ApiResponse::Object {
                    code: 201,
                    body: with_rv(obj, rev),
                    warnings,
                })
            }
            Err(e) => Err((e, obj)),
        }
    }

    /// [`Self::commit_create`]'s writing: the revision the object was written at.
    async fn commit_create_at(
        &self,
        req: &ApiRequest,
        obj: &Value,
        name: &str,
    ) -> Result<i64, ApiError> {
        let res = req.resource;
        let key = object_key(res, req.namespace.as_deref(), name);
        let value = encode(obj)?;
        // Pods count against ResourceQuotas in the same transaction that creates them, so
        // that concurrent creates can never overshoot a quota. A create that no quota
        // counts is written together with the writes waiting at the same moment (group
        // commit); one whose batch was not written is written alone below.
        let mut quota = Some(self.quota_ops(req, obj, true).await?);
        if quota.as_ref().is_some_and(Vec::is_empty) {
            let op = Op::Create {
                key: key.clone().into(),
                value: value.clone(),
                lease: 0,
            };
            match self.write_batched(op).await {
                group::Written::At(rev) => return Ok(rev),
                group::Written::Precondition => {
                    return Err(ApiError::already_exists(res.group, res.plural, name));
                }
                group::Written::Alone => {}
            }
        }
        for _attempt in 0..16 {
            let mut ops = vec![Op::Create {
                key: key.clone().into(),
                value: value.clone(),
                lease: 0,
            }];
            match quota.take() {
                Some(q) => ops.extend(q),
                None => ops.extend(self.quota_ops(req, obj, true).await?),
            }
            match self.store.txn(ops).await {
                Ok(t) => {
                    let rev = match t.results.first() {
                        Some(tessera_store::OpResult::Written(kv)) => kv.mod_revision,
                        _ => t.revision,
                    };
                    return Ok(rev);
                }
                Err(e) => match e.precondition() {
                    Some(p) if p.index == 0 => {
                        return Err(ApiError::already_exists(res.group, res.plural, name));
                    }
                    // A quota changed under us: read it again.
                    Some(_) => continue,
                    None => return Err(store_error(e)),
                },
            }
        }
        Err(ApiError::conflict_because(
            res.group,
            res.plural,
            name,
            "the namespace's resource quotas kept changing; try again",
        ))
    }

    pub(super) async fn patch(
        &self,
        req: &ApiRequest,
        user: &User,
        pt: PatchType,
        view: Option<&'static Resource>,
    ) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        if let Some(v) = view
            && pt == PatchType::Apply
        {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "server-side apply is served for {} in its stored version only: apply the {}/{} form (kubectl apply without --server-side works with {})",
                    res.plural, res.group, res.version, v.version
                ),
            ));
        }
        if pt == PatchType::StrategicMerge && res.group == "tessera.io" {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                "strategic merge patch is not supported for tessera.io kinds (as for custom resources): use a JSON merge patch (--type=merge) or a JSON patch (--type=json)",
            ));
        }
        if pt == PatchType::Apply {
            return apply::apply(self, req, user).await;
        }
        let body = req.body.clone();
        let sub = req.subresource.clone();
        let schema = match view {
            Some(v) => (kinds::of(v).schema_name)(),
            None => target_schema(req),
        };
        let scale_paths = self.scale_paths(res);
        let warnings = Vec::new();
        self.write_existing(
            req,
            user,
            move |current| {
                let mut doc = match (sub.as_deref(), view) {
                    (Some("scale"), _) => to_scale_plain(res, scale_paths.as_ref(), &current),
                    // A patch of a view applies to the object as the view shows it.
                    (_, Some(v)) => super::views::to_view(v, &current),
                    _ => current.clone(),
                };
                let result = match pt {
                    PatchType::Json => patch::json_patch(&mut doc, &body),
                    PatchType::Merge => patch::merge_patch(&mut doc, &body),
                    PatchType::StrategicMerge => patch::strategic_merge(&mut doc, &body, &schema),
                    PatchType::Apply => Ok(()),
                };
                result.map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!("the patch could not be applied: {}", e.0),
                    )
                })?;
                match view {
                    Some(v) if sub.as_deref() != Some("scale") => super::views::from_view(v, doc),
                    _ => Ok(doc),
                }
            },
            warnings,
        )
        .await
    }

    /// Reads the object, computes the new one with `change` (which sees the current object,
    /// or its Scale for the scale subresource), and writes it if nothing changed in between;
    /// retried on a concurrent change unless the new object pins a resourceVersion.
    pub(crate) async fn write_existing<F>(
        &self,
        req: &ApiRequest,
        user: &User,
        change: F,
        mut warnings: Vec<String>,
    ) -> Result<ApiResponse, ApiError>
    where
        F: Fn(Value) -> Result<Value, ApiError>,
    {
        let res = req.resource;
        let name = req.name.clone().unwrap_or_default();
        let ns = req.namespace.as_deref();
        let mut admission = self
            .admission(req, user, crate::webhooks::Operation::Update)
            .await?;
        // A CRD with a conversion webhook: the stored object is changed in the request's
        // version, and stored in the storage version.
        let conversion = self.conversion(res);
        for _attempt in 0..16 {
            let (current, kv) = self
                .read(res, ns, &name)
                .await?
                .ok_or_else(|| ApiError::not_found(res.group, res.plural, &name))?;
            let current = match &conversion {
                Some(c) => self.convert_one(c, &api_version(res), current).await?,
                None => current,
            };
            let proposed = change(current.clone())?;
            // Patched and replaced objects go through the same decoding as new ones. A
            // binding only sets a node name and a condition on the stored (already typed)
            // pod, so it is not decoded again.
            let (mut proposed, w) = match req.subresource.as_deref() {
                _ if req.verb == Verb::Update => (proposed, Vec::new()),
                Some("binding") => (proposed, Vec::new()),
                Some("status") => self.typed_status(req, &current, proposed)?,
                _ => self.typed(req, proposed)?,
            };
            warnings.extend(w);
            if req.subresource.as_deref() == Some("scale") {
                proposed = from_scale(self.scale_paths(res).as_ref(), &current, &proposed)?;
            }
            if let Some(a) = admission.as_mut()
                && self
                    .mutate_by_webhooks(a, &mut proposed, Some(&current), &mut warnings)
                    .await?
                && req.subresource.as_deref() != Some("scale")
            {
                proposed = self.retyped(req, proposed)?;
            }
            let pinned = proposed["metadata"]["resourceVersion"]
                .as_str()
                .filter(|rv| !rv.is_empty())
                .map(str::to_owned);
            if let Some(rv) = &pinned {
                let want: i64 = rv.parse().map_err(|_| {
                    ApiError::bad_request(format!(
                        "metadata.resourceVersion {rv:?} is not one this server issued"
                    ))
                })?;
                if want != kv.mod_revision {
                    return Err(ApiError::conflict(res.group, res.plural, &name));
                }
            }
            let mut next = self.merge_update(req, user, &current, proposed)?;
            self.prepare_server_owned(res, &mut next, Some(&current));
            if next == current {
                // Nothing changed: no write, the same resourceVersion (as Kubernetes).
                return Ok(ApiResponse::Object {
                    code: 200,
                    body: current,
                    warnings,
                });
            }
            let mut errors = validation::validate(res, &next);
            self.validate_more(res, &next, Some(&current), &mut errors.0);
            if !errors.is_empty() {
                return Err(ApiError::invalid(res.group, res.kind, &name, errors.0));
            }
            self.check_tenant_namespaces(res, &next).await?;
            self.check_placement_shards(res, &next).await?;
            self.check_namespace_labels(res, user, &next, Some(&current))
                .await?;
            self.check_rbac_write(res, user, &next, Some(&current))
                .await?;
            self.check_csr_approval(req, user, &next, &current).await?;
            if req.subresource.is_none()
                && next.get("spec") != current.get("spec")
                && let Some(ns) = req.namespace.as_deref()
            {
                self.admit_pod_security(res, ns, None, &next, &mut warnings)
                    .await?;
            }
            if let Some(a) = admission.as_mut() {
                self.validate_by_webhooks(a, Some(&next), Some(&current), &mut warnings)
                    .await?;
            }
            if req.params.dry_run {
                return Ok(ApiResponse::Object {
                    code: 200,
                    body: next,
                    warnings,
                });
            }
            // Removing the last finalizer of an object being deleted deletes it.
            let finalized = next["metadata"]["deletionTimestamp"].is_string()
                && next["metadata"]["finalizers"]
                    .as_array()
                    .is_none_or(|f| f.is_empty())
                && !(res.plural == "pods" && awaiting_kubelet(&next))
                && (res.plural != "namespaces" || namespace_finalized(&next));
            // What the object used is given back in the same transaction when it goes, or
            // when a pod finishes.
            let is_pod = res.plural == "pods" && res.group.is_empty();
            let refund = res.namespaced
                && (finalized
                    || (is_pod
                        && crate::quota::is_terminal(&next)
                        && !crate::quota::is_terminal(&current)));
            let value = match &conversion {
                _ if finalized => None,
                Some(c) => Some(encode(
                    &self.convert_one(c, &c.storage, next.clone()).await?,
                )?),
                None => Some(encode(&next)?),
            };
            // Stored bytes: growth is charged before the write (the tenant's own writes are
            // refused past its quota), shrinking refunded after it.
            let stored_ns = req
                .namespace
                .as_deref()
                .filter(|_| res.namespaced && value.is_some());
            let counts_bytes = match stored_ns {
                Some(ns) => self.tenant_counts_bytes(ns).await?,
                None => false,
            };
            let (old_len, new_len) = if counts_bytes {
                (
                    crate::quota::charged_len(&current),
                    crate::quota::charged_len(&next),
                )
            } else {
                (0, 0)
            };
            let grew = counts_bytes
                && crate::quota::stored_charge(new_len) > crate::quota::stored_charge(old_len);
            let grew_charged = match stored_ns {
                Some(ns) if grew => {
                    self.tenant_resize(
                        ns,
                        res,
                        &name,
                        (old_len, new_len),
                        req.params.dry_run,
                        user.is_tenant_side(),
                    )
                    .await?
                }
                _ => false,
            };
            let deleting = value.is_none();
            let mut ops = vec![match value {
                None => Op::Delete {
                    key: kv.key.clone(),
                    expected: Some(kv.mod_revision),
                },
                Some(value) => Op::Update {
                    key: kv.key.clone(),
                    value,
                    expected: kv.mod_revision,
                    lease: 0,
                },
            }];
            if refund {
                let mut quota_req = req.clone();
                quota_req.namespace = current["metadata"]["namespace"].as_str().map(str::to_owned);
                ops.extend(self.quota_ops(&quota_req, &current, false).await?);
            }
            // Not group-committed: batching updates (the agents' status reports) gained 4-5 %
            // of a whole shard's throughput and cost 100-290 ms of pod startup p50 (docs/
            // benchmarks.md); a lone transaction already shares the store's log flush.
            // Err(None): changed in between.
            let result = self
                .store
                .txn(ops)
                .await
                .map(|t| match t.results.first() {
                    Some(
                        tessera_store::OpResult::Written(kv) | tessera_store::OpResult::Deleted(kv),
                    ) => kv.mod_revision,
                    _ => t.revision,
                })
                .map_err(|e| e.precondition().is_none().then_some(e));
            if result.is_err()
                && grew_charged
                && let Some(ns) = stored_ns
                && let Err(e) = self
                    .tenant_resize(ns, res, &name, (new_len, old_len), false, false)
                    .await
            {
                tracing::warn!(error = %e, object = %name, "could not refund a tenant's stored bytes");
            }
            match result {
                Ok(rev) => {
                    self.wrote(res);
                    self.committed(res, &kv.key, (!deleting).then_some(&next), rev);
                    if refund {
                        // Gone: its stored bytes go back too; a finished pod keeps them.
                        let stored = finalized.then_some(old_len);
                        self.refund_tenant(res, &current, stored).await;
                    }
                    if counts_bytes
                        && !grew
                        && let Some(ns) = stored_ns
                        && let Err(e) = self
                            .tenant_resize(ns, res, &name, (old_len, new_len), false, false)
                            .await
                    {
                        tracing::warn!(error = %e, object = %name, "could not refund a tenant's stored bytes");
                    }
                    return Ok(ApiResponse::Object {
                        code: 200,
                        body: with_rv(next, rev),
                        warnings,
                    });
                }
                // Changed in between: read again. A client-pinned resourceVersion now
                // differs from the stored one, and the check above answers 409.
                Err(None) => continue,
                Err(Some(e)) => return Err(store_error(e)),
            }
        }
        Err(ApiError::conflict(res.group, res.plural, &name))
    }

    /// The stored object after an update: what the client may not change is kept from
    /// `current`; the main resource does not change status and the status subresource
    /// changes nothing else; generation counts spec changes; managedFields are updated.
    pub(super) fn merge_update(
        &self,
        req: &ApiRequest,
        user: &User,
        current: &Value,
        proposed: Value,
    ) -> Result<Value, ApiError> {
        let res = req.resource;
        let name = req.name.as_deref().unwrap_or_default();
        let mut next = match req.subresource.as_deref() {
            // A CertificateSigningRequest's spec never changes; its approval and its
            // issuance are separate subresources.
            sub if crate::csr::is_csr(res) => crate::csr::merge(sub, current, proposed),
            // A binding sets the node and the PodScheduled condition together.
            Some("binding") => proposed,
            // The status subresource changes the status alone: what the client sent is
            // taken as it is when nothing else in it differs from the stored object (as a
            // kubelet's status patch), without copying the stored object again.
            Some("status") if only_status_differs(current, &proposed) => proposed,
            Some("status") => {
                let mut proposed = proposed;
                let mut n = current.clone();
                n["status"] = proposed["status"].take();
                n
            }
            _ => {
                let mut n = proposed;
                if has_status(res) && res.plural != "namespaces" {
                    n["status"] = current["status"].clone();
                }
                if res.plural == "namespaces" {
                    n["status"] = current["status"].clone();
                }
                n
            }
        };
        if next["status"].is_null()
            && let Some(o) = next.as_object_mut()
        {
            o.remove("status");
        }
        let body_name = next["metadata"]["name"].as_str().unwrap_or(name).to_owned();
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if let Some(body_ns) = next["metadata"]["namespace"].as_str()
            && Some(body_ns) != req.namespace.as_deref()
            && !body_ns.is_empty()
        {
            return Err(ApiError::bad_request(format!(
                "the namespace of the object ({body_ns}) does not match the namespace on the URL ({})",
                req.namespace.as_deref().unwrap_or("none")
            )));
        }
        if !next["metadata"].is_object() {
            next["metadata"] = json!({});
        }
        if let Some(uid) = next["metadata"]["uid"].as_str()
            && Some(uid) != current["metadata"]["uid"].as_str()
        {
            return Err(ApiError::conflict_because(
                res.group,
                res.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current["metadata"]["uid"].as_str().unwrap_or_default()
                ),
            ));
        }
        for field in [
            "uid",
            "creationTimestamp",
            "namespace",
            "name",
            "generation",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
        ] {
            match current["metadata"].get(field) {
                Some(v) => next["metadata"][field] = v.clone(),
                None => {
                    if let Some(m) = next["metadata"].as_object_mut() {
                        m.remove(field);
                    }
                }
            }
        }
        // Immutable fields.
        if res.plural == "pods"
            && req.subresource.is_none()
            && let (Some(a), Some(b)) = (
                current["spec"]["nodeName"].as_str(),
                next["spec"]["nodeName"].as_str(),
            )
            && a != b
        {
            return Err(ApiError::invalid(
                res.group,
                res.kind,
                name,
                vec![Cause {
                    reason: "FieldValueForbidden",
                    field: "spec.nodeName".into(),
                    message:
                        "Forbidden: pod updates may not change the node; delete the pod instead"
                            .into(),
                }],
            ));
        }
        if res.plural == "pods"
            && current["spec"]["nodeName"].is_string()
            && next["spec"]["nodeName"].is_null()
        {
            next["spec"]["nodeName"] = current["spec"]["nodeName"].clone();
        }
        if res.plural == "services" && res.group.is_empty() {
            keep_service_addresses(current, &mut next, name)?;
        }
        let spec_changed = next.get("spec") != current.get("spec")
            || (current.get("spec").is_none()
                && strip_meta_status(&next) != strip_meta_status(current));
        if spec_changed && req.subresource.as_deref() != Some("status") {
            let g = current["metadata"]["generation"].as_i64().unwrap_or(1);
            next["metadata"]["generation"] = json!(g + 1);
        }
        if let Some(m) = next["metadata"].as_object_mut() {
            m.retain(|_, v| !v.is_null());
        }
        let manager = req
            .params
            .field_manager
            .clone()
            .unwrap_or_else(|| user.manager());
        let op = if matches!(req.verb, Verb::Patch(PatchType::Apply)) {
            "Apply"
        } else {
            "Update"
        };
        // A binding is not a field manager's write: Kubernetes' registry sets the node and
        // the PodScheduled condition without recording them in managedFields.
        if op == "Update" && req.subresource.as_deref() != Some("binding") {
            apply::record_update_of(
                &mut next,
                Some(current),
                &manager,
                &api_version(res),
                op,
                req.subresource
                    .as_deref()
                    .filter(|s| matches!(*s, "status" | "scale")),
            );
        }
        Ok(next)
    }
}

/// A Service keeps the addresses it was given: an update that leaves them out keeps them
/// (as Kubernetes does), one that changes them is refused — they are immutable.
fn keep_service_addresses(current: &Value, next: &mut Value, name: &str) -> Result<(), ApiError> {
    let old_ip = &current["spec"]["clusterIP"];
    match next["spec"]["clusterIP"].as_str() {
        None | Some("") if !old_ip.is_null() && next["spec"].is_object() => {
            for f in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
                if !current["spec"][f].is_null() && next["spec"][f].is_null() {
                    next["spec"][f] = current["spec"][f].clone();
                }
            }
            next["spec"]["clusterIP"] = old_ip.clone();
        }
        Some(ip) if Some(ip) != old_ip.as_str() && !old_ip.is_null() => {
            return Err(ApiError::invalid(
                "",
                "Service",
                name,
                vec![Cause {
                    reason: "FieldValueInvalid",
                    field: "spec.clusterIP".into(),
                    message: format!("Invalid value: {ip:?}: field is immutable"),
                }],
            ));
        }
        _ => {}
    }
    let old_ports = current["spec"]["ports"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if let Some(ports) = next["spec"]["ports"].as_array_mut() {
        for p in ports {
            let held = old_ports
                .iter()
                .find(|o| o["port"] == p["port"] && o["protocol"] == p["protocol"])
                .map(|o| o["nodePort"].clone())
                .unwrap_or(Value::Null);
            if p["nodePort"].is_null() && !held.is_null() {
                p["nodePort"] = held;
            }
        }
    }
    Ok(())
}
