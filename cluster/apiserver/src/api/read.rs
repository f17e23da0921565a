//! Reads: get, list (selectors, paging, resourceVersion semantics) and watch, assembled from
//! stored bytes.

use super::*;

/// The value of a field selector's field in an object (`metadata.name`, `spec.nodeName`).
pub(super) fn field_value<'a>(res: &Resource, obj: &'a Value, field: &str) -> Option<&'a str> {
    let mut v = obj;
    for part in field.split('.') {
        v = v.get(part)?;
    }
    // Absent string fields compare as "", as in Kubernetes (`spec.nodeName=` selects
    // unscheduled pods).
    let _ = res;
    v.as_str()
}

/// The fields each kind can be selected by, besides `metadata.name` and `metadata.namespace`.
pub(super) fn selectable_fields(res: &Resource) -> &'static [&'static str] {
    match (res.group, res.kind) {
        ("", "Pod") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "Node") => &["spec.unschedulable"],
        ("", "Event") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("", "Secret") => &["type"],
        ("", "Namespace") => &["status.phase"],
        ("apps", "ReplicaSet") => &["status.replicas"],
        ("batch", "Job") => &["status.successful"],
        _ => &[],
    }
}

/// A matcher for list and watch: labels and fields.
pub(super) struct Filter {
    labels: Option<tessera_core::selector::label::LabelSelector>,
    fields: Option<tessera_core::selector::field::FieldSelector>,
    res: &'static Resource,
}

impl Filter {
    fn new(req: &ApiRequest) -> Result<Filter, ApiError> {
        if let Some(fs) = &req.params.field_selector {
            let allowed = selectable_fields(req.resource);
            for r in fs.requirements() {
                if r.field != "metadata.name"
                    && r.field != "metadata.namespace"
                    && !allowed.contains(&r.field.as_str())
                {
                    return Err(ApiError::bad_request(format!(
                        "field label not supported: {} (the fields of {} that can be selected are metadata.name, metadata.namespace{})",
                        r.field,
                        req.resource.plural,
                        allowed.iter().map(|f| format!(", {f}")).collect::<String>()
                    )));
                }
            }
        }
        Ok(Filter {
            labels: req.params.label_selector.clone(),
            fields: req.params.field_selector.clone(),
            res: req.resource,
        })
    }

    /// True if it matches everything (no selectors): objects need not be decoded.
    fn is_trivial(&self) -> bool {
        self.labels.as_ref().is_none_or(|l| l.is_empty())
            && self.fields.as_ref().is_none_or(|f| f.is_empty())
    }

    fn matches(&self, obj: &Value) -> bool {
        if let Some(ls) = &self.labels {
            let labels = &obj["metadata"]["labels"];
            if !ls.matches_with(|k| labels.get(k).and_then(Value::as_str)) {
                return false;
            }
        }
        if let Some(fs) = &self.fields {
            let owned: BTreeMap<String, String> = fs
                .requirements()
                .iter()
                .map(|r| {
                    let v = match r.field.as_str() {
                        "spec.unschedulable" | "spec.hostNetwork" => obj["spec"]
                            [r.field.trim_start_matches("spec.")]
                        .as_bool()
                        .unwrap_or(false)
                        .to_string(),
                        "status.replicas" | "status.successful" => obj["status"]
                            [r.field.trim_start_matches("status.")]
                        .as_i64()
                        .unwrap_or(0)
                        .to_string(),
                        "source" => obj["source"]["component"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        f => field_value(self.res, obj, f).unwrap_or_default().to_owned(),
                    };
                    (r.field.clone(), v)
                })
                .collect();
            if !fs.matches_with(|f| owned.get(f).map(String::as_str)) {
                return false;
            }
        }
        true
    }
}

/// True if revision `a` is at or after `b` (every part, for composite revisions).
pub(super) fn revision_at_least(a: &Revision, b: &Revision) -> bool {
    let parts = |r: &Revision| -> Vec<i64> {
        r.to_string()
            .trim_start_matches("c.")
            .split('.')
            .filter_map(|p| p.parse().ok())
            .collect()
    };
    let (pa, pb) = (parts(a), parts(b));
    if pa.len() != pb.len() {
        return pa.iter().sum::<i64>() >= pb.iter().sum::<i64>();
    }
    pa.iter().zip(&pb).all(|(x, y)| x >= y)
}

/// The items of a list, as stored bytes with their revisions, and where it stopped.
pub(super) struct Items {
    pub(super) items: Vec<(Bytes, i64)>,
    pub(super) revision: Revision,
    pub(super) next: Option<String>,
}

impl Api {
    pub(super) async fn read(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<(Value, KeyValue)>, ApiError> {
        match self
            .store
            .get(object_key(res, ns, name).as_bytes())
            .await
            .map_err(store_error)?
        {
            Some(kv) => {
                let mut obj = decode_stored(&kv)?;
                // A custom object is read in the version asked for (conversion `None`: only
                // `apiVersion` differs), so a write through any served version applies to it.
                // With a conversion webhook it stays as stored, for the caller to convert.
                if res.custom && self.conversion(res).is_none() {
                    obj["apiVersion"] = json!(api_version(res));
                }
                Ok(Some((obj, kv)))
            }
            None => Ok(None),
        }
    }

    pub(super) async fn get(&self, req: &ApiRequest) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        let name = req.name.as_deref().unwrap_or_default();
        let kv = self
            .store
            .get(object_key(res, req.namespace.as_deref(), name).as_bytes())
            .await
            .map_err(store_error)?
            .ok_or_else(|| ApiError::not_found(res.group, res.plural, name))?;
        let mut out = Vec::with_capacity(kv.value.len() + 16);
        render(&kv.value, kv.mod_revision, &mut out)?;
        Ok(ApiResponse::Encoded {
            code: 200,
            body: Bytes::from(out),
        })
    }

    /// A list: label/field selectors, `limit`/`continue`, and resourceVersion semantics
    /// (unset: latest; `0`: any; with `resourceVersionMatch=Exact`: that revision;
    /// otherwise not older than it). The body is assembled from the stored bytes.
    pub(super) async fn list(
        &self,
        req: &ApiRequest,
        allowed_namespaces: &Option<Vec<String>>,
    ) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        let found = self.list_items(req, allowed_namespaces).await?;
        let mut out =
            Vec::with_capacity(128 + found.items.iter().map(|(b, _)| b.len() + 24).sum::<usize>());
        out.extend_from_slice(br#"{"kind":"#);
        write_str(&mut out, &format!("{}List", res.kind))?;
        out.extend_from_slice(br#","apiVersion":"#);
        write_str(&mut out, &api_version(res))?;
        out.extend_from_slice(br#","metadata":{"resourceVersion":"#);
        write_str(&mut out, &found.revision.to_string())?;
        if let Some(t) = &found.next {
            out.extend_from_slice(br#","continue":"#);
            write_str(&mut out, t)?;
        }
        out.extend_from_slice(br#"},"items":["#);
        for (i, (value, rev)) in found.items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            render(value, *rev, &mut out)?;
        }
        out.extend_from_slice(b"]}");
        Ok(ApiResponse::Encoded {
            code: 200,
            body: Bytes::from(out),
        })
    }

    pub(super) async fn list_items(
        &self,
        req: &ApiRequest,
        allowed_namespaces: &Option<Vec<String>>,
    ) -> Result<Items, ApiError> {
        let res = req.resource;
        let filter = Filter::new(req)?;
        let p = &req.params;
        let mut revision: Option<Revision> = None;
        if p.continue_token.is_none()
            && let Some(rv) = p.resource_version.as_deref().filter(|rv| *rv != "0")
        {
            let asked: Revision = rv.parse().map_err(|_| {
                ApiError::bad_request(format!(
                    "resourceVersion {rv:?} is not one this server issued"
                ))
            })?;
            if p.resource_version_match.as_deref() == Some("Exact") {
                revision = Some(asked);
            } else {
                let current = self.store.current_revision().await.map_err(store_error)?;
                if !revision_at_least(&current, &asked) {
                    return Err(ApiError::new(
                        504,
                        "Timeout",
                        format!(
                            "Too large resource version: {rv}, current resource version: {current}"
                        ),
                    ));
                }
            }
        } else if p.resource_version_match.is_some() && p.resource_version.is_none() {
            return Err(ApiError::bad_request(
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        let list_prefix = prefix(res, req.namespace.as_deref());
        let limit = p.limit;
        let decode = !filter.is_trivial() || allowed_namespaces.is_some();
        let mut items = Vec::new();
        let mut store_req = ListRequest {
            prefix: list_prefix.clone().into(),
            revision,
            limit: if limit == 0 {
                1000
            } else {
                limit.clamp(1, 1000)
            },
            continue_token: p.continue_token.clone(),
        };
        let mut next = None;
        let rev = loop {
            let page = self
                .store
                .list(store_req.clone())
                .await
                .map_err(|e| match e {
                    StoreError::InvalidToken { .. } => ApiError::bad_request(format!(
                        "the continue token is not valid ({e}); start the list again without it"
                    )),
                    e => store_error(e),
                })?;
            let page_rev = page.revision.clone();
            let n = page.kvs.len();
            for (i, kv) in page.kvs.iter().enumerate() {
                if decode {
                    let obj = decode_stored(kv)?;
                    if let Some(allowed) = allowed_namespaces
                        && !allowed.iter().any(|a| a == name_of(&obj))
                    {
                        continue;
                    }
                    if !filter.matches(&obj) {
                        continue;
                    }
                }
                items.push((kv.value.clone(), kv.mod_revision));
                if limit > 0 && items.len() == limit {
                    // More may follow: the next page starts after this key.
                    let more = i + 1 < n || page.continue_token.is_some();
                    if more {
                        let cursor = Cursor {
                            prefix: list_prefix.clone().into(),
                            revision: None,
                            start: Bytes::new(),
                        };
                        next = Some(cursor.next_token(&page_rev, &kv.key));
                    }
                    break;
                }
            }
            if (limit > 0 && items.len() == limit) || page.continue_token.is_none() {
                break page_rev;
            }
            store_req.continue_token = page.continue_token;
            store_req.revision = None;
        };
        Ok(Items {
            items,
            revision: rev,
            next,
        })
    }

    /// A watch. Without a resourceVersion (or with `0`) it starts with an `ADDED` event for
    /// every existing object, as Kubernetes does; with one, it resumes just after it, or
    /// answers a `410 Gone` event when that was compacted away.
    pub(super) async fn watch(
        &self,
        req: &ApiRequest,
        allowed_namespaces: Option<Vec<String>>,
    ) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        let filter = Arc::new(Filter::new(req)?);
        let watch_prefix = prefix(res, req.namespace.as_deref());
        let mut initial = Vec::new();
        let after = match req.params.resource_version.as_deref() {
            None | Some("0") => {
                let mut lr = req.clone();
                lr.params.limit = 0;
                lr.params.continue_token = None;
                lr.params.resource_version = None;
                lr.params.resource_version_match = None;
                lr.table = false;
                let found = self.list_items(&lr, &allowed_namespaces).await?;
                for (value, rev) in &found.items {
                    initial.push(WatchEvent::Encoded(event_line("ADDED", value, *rev)?));
                }
                Some(found.revision)
            }
            Some(rv) => Some(rv.parse::<Revision>().map_err(|_| {
                ApiError::bad_request(format!(
                    "resourceVersion {rv:?} is not one this server issued"
                ))
            })?),
        };
        let gone = |e: &StoreError| json!({"type": "ERROR", "object": ApiError::gone(format!("too old resource version: {e}")).to_status()});
        let bookmarks = req.params.allow_bookmarks;
        let kind = res.kind;
        let version = api_version(res);
        let allowed = Arc::new(allowed_namespaces);
        let after = after.ok_or_else(|| ApiError::internal("a watch without a revision"))?;
        // Events at or before `after` that share a batch with later ones are skipped.
        let floor = match after.parts() {
            [one] => *one,
            _ => i64::MIN,
        };
        let resource_prefix = prefix(res, None);
        let ns_prefix = Bytes::from(watch_prefix.clone());
        // `timeoutSeconds` ends the watch between batches of the watch cache, never inside
        // one: objects written in one transaction share a revision, and a client resumes a
        // cut watch from the last resourceVersion it saw, so a cut inside a revision would
        // lose the rest of it.
        let deadline = req
            .params
            .timeout_seconds
            .map(|t| tokio::time::Instant::now() + Duration::from_secs(t));
        let timed_out = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let events: WatchStream = match self
            .watch_cache
            .watch(&resource_prefix, &watch_prefix, after)
            .await
        {
            Ok(w) => {
                let mut last_bookmark = Instant::now();
                let decode = !filter.is_trivial() || allowed.is_some();
                Box::pin(w.take_until(timed_out).flat_map(move |item| {
                    let out: Vec<WatchEvent> = match item {
                        Ok(batch) => {
                            let mut out = Vec::with_capacity(batch.events.len() + 1);
                            for e in &batch.events {
                                if e.rev <= floor || !e.key.starts_with(&ns_prefix) {
                                    continue;
                                }
                                let Some(line) = &e.line else { continue };
                                if !decode {
                                    out.push(WatchEvent::Encoded(line.clone()));
                                    continue;
                                }
                                let Ok(obj) = serde_json::from_slice::<Value>(&e.value) else {
                                    continue;
                                };
                                if let Some(a) = allowed.as_ref()
                                    && !a.iter().any(|n| n == name_of(&obj))
                                {
                                    continue;
                                }
                                // An object that stops matching leaves the watch as DELETED;
                                // one that starts matching joins it as ADDED.
                                let now = filter.matches(&obj);
                                let before = e.ty == "MODIFIED"
                                    && e.prev
                                        .as_ref()
                                        .and_then(|p| serde_json::from_slice::<Value>(p).ok())
                                        .is_some_and(|p| filter.matches(&p));
                                let ty = match (e.ty, before, now) {
                                    ("MODIFIED", false, true) => "ADDED",
                                    ("MODIFIED", true, false) => "DELETED",
                                    (_, _, false) => continue,
                                    (t, _, _) => t,
                                };
                                if ty == e.ty {
                                    out.push(WatchEvent::Encoded(line.clone()));
                                } else if let Ok(l) = event_line(ty, &e.value, e.rev) {
                                    out.push(WatchEvent::Encoded(l));
                                }
                            }
                            if bookmarks
                                && (batch.events.is_empty()
                                    || last_bookmark.elapsed() > BOOKMARK_EVERY)
                            {
                                last_bookmark = Instant::now();
                                out.push(WatchEvent::Value(
                                        json!({"type": "BOOKMARK", "object": {
                                    "kind": kind, "apiVersion": version,
                                    "metadata": {"resourceVersion": batch.revision.to_string()}}}),
                                    ));
                            }
                            out
                        }
                        Err(e) => vec![WatchEvent::Value(gone(&e))],
                    };
                    futures::stream::iter(out)
                }))
            }
            Err(e @ StoreError::Compacted { .. }) => {
                Box::pin(futures::stream::iter(vec![WatchEvent::Value(gone(&e))]))
            }
            Err(e) => return Err(store_error(e)),
        };
        let mut stream: WatchStream = Box::pin(futures::stream::iter(initial).chain(events));
        if let Some(m) = &self.metrics {
            stream = Box::pin(m.count_watch(res, stream));
        }
        Ok(ApiResponse::Watch(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_compare_part_by_part() {
        let r = |s: &str| s.parse::<Revision>().expect("revision");
        assert!(revision_at_least(&r("10"), &r("9")));
        assert!(!revision_at_least(&r("9"), &r("10")));
        assert!(revision_at_least(&r("c.5.7"), &r("c.5.6")));
        assert!(!revision_at_least(&r("c.5.7"), &r("c.6.1")));
    }
}
