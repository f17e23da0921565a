//! Reads across shards, at the federation: pods and nodes live in the shards, and events in
//! the shards and the federation. A get, list or watch of them here is made in every shard
//! (through the [`ShardSet`], over each shard's own stream) and the answers are merged:
//!
//! - every object read from a shard carries the label `tessera.io/shard: <shard>` (Tables get
//!   a SHARD column); a label selector on that label picks the shards to read and is not sent
//!   on;
//! - a list walks the sources in order (the federation's own store first, for events; then the
//!   shards by name) and `limit`/`continue` page across them: the continue token names the
//!   source to go on in and that source's own token;
//! - the resourceVersion of a list and of every watch event is composite — each source's
//!   revision by name (`f.shard-0=812;shard-1=c.40.41`) — so a watch resumed from it resumes
//!   every shard where it was;
//! - a watch merges the sources' watches and ends when any of them ends (a shard left, the
//!   timeout), so the client's next watch reads the shards as they are then;
//! - `pods/log` is read from the shard that holds the pod.
//!
//! The user was authorized at the federation before any of this (a tenant names its own
//! namespaces, exactly as on a shard). Writes of pods and nodes are refused here: they belong
//! to a shard.

use std::collections::BTreeMap;

use base64::Engine;
use tessera_client::client::{Client, PodStreamRequest, ShardSet, Switched};
use tessera_client::types::SHARD_LABEL;
use tessera_core::selector::label::{LabelSelector, Requirement};

use super::*;

/// The federation's own store, as a source; sorts before every shard (a DNS label).
const LOCAL: &str = ".";

/// Where the objects of a resource read across shards come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Across {
    /// Only the shards (pods, nodes).
    Shards,
    /// The federation's own store and the shards (events).
    LocalAndShards,
}

/// A resource's sources at the federation, if it is read across shards.
pub(super) fn across_of(res: &Resource) -> Option<Across> {
    match (res.group, res.plural) {
        ("", "pods" | "nodes") => Some(Across::Shards),
        ("", "events") | ("events.k8s.io", "events") => Some(Across::LocalAndShards),
        _ => None,
    }
}

/// A composite resourceVersion: each source's revision by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Composite(BTreeMap<String, String>);

impl Composite {
    fn parse(s: &str) -> Option<Composite> {
        let body = s.strip_prefix("f.")?;
        let mut out = BTreeMap::new();
        for part in body.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=')?;
            if v.is_empty() {
                return None;
            }
            out.insert(k.to_owned(), v.to_owned());
        }
        Some(Composite(out))
    }
}

impl std::fmt::Display for Composite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("f.")?;
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

/// Where a paged list goes on: the revisions so far, the source, that source's token.
#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
struct Continue {
    rv: String,
    at: String,
    token: Option<String>,
}

impl Continue {
    fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    fn decode(s: &str) -> Result<Continue, ApiError> {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| {
                ApiError::bad_request(
                    "the continue token is not one the federation issued; start the list again without it",
                )
            })
    }
}

/// One place objects come from.
enum Source {
    Local,
    Shard(String, Arc<dyn Client>),
}

impl Source {
    fn name(&self) -> &str {
        match self {
            Source::Local => LOCAL,
            Source::Shard(n, _) => n,
        }
    }
}

/// A merged watch's item: a source's event, or the end of a source.
enum Tagged {
    Event(String, WatchEvent),
    End,
}

/// Labels a shard's object with its shard (the federation's own are left as they are).
fn label(obj: &mut Value, shard: &str) {
    if shard == LOCAL || !obj.is_object() {
        return;
    }
    let meta = &mut obj["metadata"];
    if !meta["labels"].is_object() {
        meta["labels"] = json!({});
    }
    meta["labels"][SHARD_LABEL] = json!(shard);
}

/// The selector without its requirements on the shard label, and those requirements.
fn split_selector(sel: Option<&LabelSelector>) -> (Option<LabelSelector>, Vec<Requirement>) {
    let Some(sel) = sel else {
        return (None, Vec::new());
    };
    let (on_shard, rest): (Vec<Requirement>, Vec<Requirement>) = sel
        .requirements()
        .iter()
        .cloned()
        .partition(|r| r.key == SHARD_LABEL);
    let rest = (!rest.is_empty()).then(|| LabelSelector::from_requirements(rest));
    (rest, on_shard)
}

impl Api {
    /// The same API reading pods, nodes and events across `shards` (the federation's).
    pub fn with_shards(mut self, shards: Arc<dyn ShardSet>) -> Api {
        self.shards = Some(shards);
        self
    }

    /// How `res` is read here, if across shards.
    pub(super) fn across(&self, res: &Resource) -> Option<Across> {
        self.shards.as_ref()?;
        across_of(res)
    }

    /// The sources of `req` in order, after the shard label's requirements.
    fn sources(&self, req: &ApiRequest, across: Across, on_shard: &[Requirement]) -> Vec<Source> {
        let mut out = Vec::new();
        if across == Across::LocalAndShards && on_shard.iter().all(|r| r.matches(None)) {
            out.push(Source::Local);
        }
        let _ = req;
        if let Some(set) = &self.shards {
            for (name, client) in set.shards() {
                if on_shard.iter().all(|r| r.matches(Some(&name))) {
                    out.push(Source::Shard(name, client));
                }
            }
        }
        out
    }

    /// Serves a read of a resource read across shards; refuses writes of the ones that live
    /// only in shards.
    pub(super) async fn across_shards(
        &self,
        req: &ApiRequest,
        across: Across,
        allowed_namespaces: &Option<Vec<String>>,
    ) -> Option<Result<ApiResponse, ApiError>> {
        let res = req.resource;
        match req.verb {
            Verb::Get => Some(self.get_across(req, across).await),
            Verb::List => Some(self.list_across(req, across, allowed_namespaces).await),
            Verb::Watch => Some(self.watch_across(req, across, allowed_namespaces).await),
            _ if across == Across::LocalAndShards => None,
            v => Some(Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!(
                    "{} live in the shards: the federation reads them across shards (get, list, watch, logs) but does not {} them; apply a workload here and the federation places it, or change {} in its shard's API (kubectl --context <shard>; the tessera.io/shard label names it)",
                    res.plural,
                    v.as_str(),
                    res.plural
                ),
            ))),
        }
    }

    /// A get (or a pod's log): the first source that has the object.
    async fn get_across(&self, req: &ApiRequest, across: Across) -> Result<ApiResponse, ApiError> {
        if across == Across::LocalAndShards {
            match self.get(req).await {
                Ok(r) => return Ok(r),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let (shard, client, found) = self.locate(req, across).await?;
        if req.subresource.as_deref() == Some("log") {
            return client.call(req.clone()).await;
        }
        let mut obj = found
            .into_value()
            .ok_or_else(|| ApiError::internal("a shard answered a get with no object"))?;
        label(&mut obj, &shard);
        Ok(ApiResponse::ok(obj))
    }

    /// The shard that holds the object `req` names (the first in name order, asking all at
    /// once), its client and the object as read there; 404 if none has it, 503 if some did
    /// not answer.
    async fn locate(
        &self,
        req: &ApiRequest,
        across: Across,
    ) -> Result<(String, Arc<dyn Client>, ApiResponse), ApiError> {
        let res = req.resource;
        let name = req.name.as_deref().unwrap_or_default();
        let sources = self.sources(req, across, &[]);
        let mut probe = req.clone();
        probe.verb = Verb::Get;
        probe.subresource = None;
        probe.table = false;
        let asks = sources.iter().filter_map(|s| match s {
            Source::Local => None,
            Source::Shard(n, c) => {
                let probe = probe.clone();
                Some(async move { (n.clone(), c.clone(), c.call(probe).await) })
            }
        });
        let answers = futures::future::join_all(asks).await;
        let mut unavailable = Vec::new();
        for (shard, client, answer) in answers {
            match answer {
                Ok(found) => return Ok((shard, client, found)),
                Err(e) if e.code == 404 => {}
                Err(e) => unavailable.push(format!("{shard}: {}", e.message)),
            }
        }
        if unavailable.is_empty() {
            Err(ApiError::not_found(res.group, res.plural, name))
        } else {
            let mut e = ApiError::new(
                503,
                "ServiceUnavailable",
                format!(
                    "{} {name:?} is in none of the shards that answered; not answered: {}",
                    res.plural,
                    unavailable.join("; ")
                ),
            );
            e.retry_after = Some(1);
            Err(e)
        }
    }

    /// A pod's exec, attach or port-forward at the federation, for a user already
    /// authorized here: opened in the shard that holds the pod, by that shard's agent, and
    /// tunnelled over the shard's stream.
    pub(super) async fn pod_stream_across(
        &self,
        req: &ApiRequest,
        stream: &PodStreamRequest,
    ) -> Result<Switched, ApiError> {
        let (shard, client, _) = self.locate(req, Across::Shards).await?;
        tracing::info!(namespace = %stream.namespace, pod = %stream.name, sub = %stream.subresource, %shard, "streaming to a pod through its shard");
        client.pod_stream(stream).await
    }

    /// A list: the sources in order, paged across them.
    async fn list_across(
        &self,
        req: &ApiRequest,
        across: Across,
        allowed_namespaces: &Option<Vec<String>>,
    ) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        let (selector, on_shard) = split_selector(req.params.label_selector.as_ref());
        let sources = self.sources(req, across, &on_shard);
        let p = &req.params;
        let (mut revisions, start_at, mut token) = match &p.continue_token {
            Some(t) => {
                let c = Continue::decode(t)?;
                let rv = Composite::parse(&c.rv).ok_or_else(|| {
                    ApiError::bad_request("the continue token's resourceVersion is malformed")
                })?;
                (rv, Some(c.at), c.token)
            }
            None => (Composite::default(), None, None),
        };
        let asked = match p.resource_version.as_deref() {
            None | Some("0") => None,
            Some(rv) => Some(Composite::parse(rv).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "resourceVersion {rv:?} is not one the federation issued (a read across shards has a composite version, f.<shard>=<version>;…)"
                ))
            })?),
        };
        let limit = p.limit;
        let mut items: Vec<Value> = Vec::new();
        let mut next: Option<Continue> = None;
        let from = match &start_at {
            Some(at) => sources
                .iter()
                .position(|s| s.name() >= at.as_str())
                .unwrap_or(sources.len()),
            None => 0,
        };
        for (i, source) in sources.iter().enumerate().skip(from) {
            let mut sub = req.clone();
            sub.table = false;
            sub.params.label_selector = selector.clone();
            sub.params.continue_token = if start_at.as_deref() == Some(source.name()) {
                token.take()
            } else {
                None
            };
            if limit > 0 {
                sub.params.limit = limit - items.len();
            }
            if sub.params.continue_token.is_some() {
                sub.params.resource_version = None;
                sub.params.resource_version_match = None;
            } else if let Some(asked) = &asked {
                match asked.0.get(source.name()) {
                    Some(rv) => sub.params.resource_version = Some(rv.clone()),
                    None => {
                        sub.params.resource_version = None;
                        sub.params.resource_version_match = None;
                    }
                }
            }
            let body = match source {
                Source::Local => self
                    .list(&sub, allowed_namespaces)
                    .await?
                    .into_value()
                    .ok_or_else(|| ApiError::internal("a list answered no JSON"))?,
                Source::Shard(name, client) => client.list(sub).await.map_err(|mut e| {
                    e.message = format!("shard {name}: {}", e.message);
                    e
                })?,
            };
            if let Some(rv) = body["metadata"]["resourceVersion"].as_str() {
                revisions.0.insert(source.name().to_owned(), rv.to_owned());
            }
            if let Some(list) = body.get("items").and_then(Value::as_array) {
                for item in list {
                    let mut item = item.clone();
                    label(&mut item, source.name());
                    items.push(item);
                }
            }
            let more_here = body["metadata"]["continue"]
                .as_str()
                .filter(|t| !t.is_empty());
            if let Some(t) = more_here {
                next = Some(Continue {
                    rv: String::new(),
                    at: source.name().to_owned(),
                    token: Some(t.to_owned()),
                });
                break;
            }
            if limit > 0 && items.len() >= limit {
                if let Some(following) = sources.get(i + 1) {
                    next = Some(Continue {
                        rv: String::new(),
                        at: following.name().to_owned(),
                        token: None,
                    });
                }
                break;
            }
        }
        let rv = revisions.to_string();
        let mut metadata = json!({"resourceVersion": rv});
        if let Some(mut c) = next {
            c.rv = rv;
            metadata["continue"] = json!(c.encode());
        }
        Ok(ApiResponse::ok(json!({
            "kind": format!("{}List", res.kind),
            "apiVersion": api_version(res),
            "metadata": metadata,
            "items": items,
        })))
    }

    /// A watch: the sources' watches merged, each event's object labelled with its shard and
    /// given the composite resourceVersion after it.
    async fn watch_across(
        &self,
        req: &ApiRequest,
        across: Across,
        allowed_namespaces: &Option<Vec<String>>,
    ) -> Result<ApiResponse, ApiError> {
        let (selector, on_shard) = split_selector(req.params.label_selector.as_ref());
        let sources = self.sources(req, across, &on_shard);
        let from = match req.params.resource_version.as_deref() {
            None => None,
            Some("0") => Some(Composite::default()),
            Some(rv) => match Composite::parse(rv) {
                Some(c) => Some(c),
                None => {
                    // Not a version the federation gave: the client lists again.
                    let gone = ApiError::gone(format!(
                        "resourceVersion {rv:?} is not a composite version of the federation: list again"
                    ));
                    return Ok(ApiResponse::Watch(Box::pin(futures::stream::iter([
                        WatchEvent::Value(json!({"type": "ERROR", "object": gone.to_status()})),
                    ]))));
                }
            },
        };
        let mut revisions = Composite::default();
        let mut streams: Vec<std::pin::Pin<Box<dyn futures::Stream<Item = Tagged> + Send>>> =
            Vec::new();
        for source in &sources {
            let mut sub = req.clone();
            sub.table = false;
            sub.params.label_selector = selector.clone();
            // A source the version does not name (a shard that joined since) starts from
            // its beginning: its objects are all new to this client.
            sub.params.resource_version = from.as_ref().map(|c| {
                c.0.get(source.name())
                    .cloned()
                    .unwrap_or_else(|| "0".into())
            });
            if let Some(rv) = &sub.params.resource_version {
                revisions.0.insert(source.name().to_owned(), rv.clone());
            }
            let name = source.name().to_owned();
            let events = match source {
                Source::Local => match self.watch(&sub, allowed_namespaces.clone()).await? {
                    ApiResponse::Watch(w) => w,
                    _ => return Err(ApiError::internal("a watch answered an object")),
                },
                Source::Shard(_, client) => client.watch(sub).await.map_err(|mut e| {
                    e.message = format!("shard {name}: {}", e.message);
                    e
                })?,
            };
            // Each source's events, then one marker when it ends.
            let tagged = events
                .map(move |ev| Tagged::Event(name.clone(), ev))
                .chain(futures::stream::once(async { Tagged::End }));
            streams.push(Box::pin(tagged));
        }
        let merged = futures::stream::select_all(streams);
        let kind = req.resource.kind;
        let version = api_version(req.resource);
        let out = merged
            .scan(revisions, move |revisions, item| {
                // A source ended: so does this watch.
                let Tagged::Event(source, ev) = item else {
                    return futures::future::ready(None);
                };
                let mut ev = ev.into_value();
                let ty = ev["type"].as_str().unwrap_or_default().to_owned();
                if ty == "ERROR" {
                    return futures::future::ready(Some(Some(WatchEvent::Value(ev))));
                }
                if let Some(rv) = ev["object"]["metadata"]["resourceVersion"].as_str() {
                    revisions.0.insert(source.clone(), rv.to_owned());
                }
                let composite = revisions.to_string();
                if ty == "BOOKMARK" {
                    return futures::future::ready(Some(Some(WatchEvent::Value(json!({
                        "type": "BOOKMARK",
                        "object": {"kind": kind, "apiVersion": version,
                                   "metadata": {"resourceVersion": composite}},
                    })))));
                }
                label(&mut ev["object"], &source);
                ev["object"]["metadata"]["resourceVersion"] = json!(composite);
                futures::future::ready(Some(Some(WatchEvent::Value(ev))))
            })
            .filter_map(|x| async move { x });
        // An ERROR ends the watch after it is sent (the client lists again).
        let mut errored = false;
        let out = out.take_while(move |ev| {
            let go = !errored;
            if let WatchEvent::Value(v) = ev
                && v["type"] == "ERROR"
            {
                errored = true;
            }
            futures::future::ready(go)
        });
        Ok(ApiResponse::Watch(Box::pin(out)))
    }
}

impl Api {
    /// At the federation, a Placement may name only shards that have joined and labels some
    /// joined shard has: a policy no shard can satisfy is refused, with the shards there are.
    pub(super) async fn check_placement_shards(
        &self,
        res: &Resource,
        obj: &Value,
    ) -> Result<(), ApiError> {
        if self.shards.is_none() || (res.group, res.kind) != ("tessera.io", "Placement") {
            return Ok(());
        }
        let shards_res = crate::request::find_resource("tessera.io", "v1alpha1", "shards")?;
        let kvs = self
            .store
            .list(ListRequest {
                prefix: prefix(shards_res, None).into(),
                ..Default::default()
            })
            .await
            .map_err(store_error)?
            .kvs;
        let known: BTreeMap<String, Value> = kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice::<Value>(&kv.value).ok())
            .map(|s| (name_of(&s).to_owned(), s["metadata"]["labels"].clone()))
            .collect();
        let list = if known.is_empty() {
            "none has joined yet".to_owned()
        } else {
            format!(
                "the shards are {}",
                known.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        };
        let spec = &obj["spec"];
        let mut causes = Vec::new();
        let mut unknown = |field: String, name: &str| {
            if !known.contains_key(name) {
                causes.push(Cause {
                    reason: "FieldValueNotFound",
                    field,
                    message: format!("Not found: {name:?}: no shard of that name has joined the federation ({list})"),
                });
            }
        };
        for (i, n) in spec["shardAffinity"]["shardNames"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            unknown(
                format!("spec.shardAffinity.shardNames[{i}]"),
                n.as_str().unwrap_or_default(),
            );
        }
        for (i, w) in spec["replicas"]["weights"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            unknown(
                format!("spec.replicas.weights[{i}].shard"),
                w["shard"].as_str().unwrap_or_default(),
            );
        }
        if let Some(want) = spec["shardAffinity"]["matchLabels"].as_object()
            && !want.is_empty()
            && !known
                .values()
                .any(|labels| want.iter().all(|(k, v)| &labels[k] == v))
        {
            let wanted: Vec<String> = want
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect();
            causes.push(Cause {
                reason: "FieldValueNotFound",
                field: "spec.shardAffinity.matchLabels".into(),
                message: format!(
                    "Not found: no shard has the labels {}: no shard could ever take these workloads (kubectl get shards --show-labels)",
                    wanted.join(",")
                ),
            });
        }
        for (i, c) in spec["spreadConstraints"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let label = c["spreadByLabel"].as_str().unwrap_or_default();
            let min = c["minGroups"].as_u64().unwrap_or(1);
            let mut values: Vec<&str> = known
                .values()
                .filter_map(|labels| labels[label].as_str())
                .collect();
            values.sort_unstable();
            values.dedup();
            if (values.len() as u64) < min {
                causes.push(Cause {
                    reason: "FieldValueInvalid",
                    field: format!("spec.spreadConstraints[{i}].minGroups"),
                    message: format!(
                        "Invalid value: {min}: the shards have {} value(s) of {label}{}: no placement could ever spread over {min}",
                        values.len(),
                        if values.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", values.join(", "))
                        }
                    ),
                });
            }
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(res.group, res.kind, name_of(obj), causes))
        }
    }
}

/// A Table of objects read across shards gets a SHARD column: each row's shard label.
pub(super) fn add_shard_column(table: &mut Value, objects: &[&Value]) {
    if let Some(cols) = table["columnDefinitions"].as_array_mut() {
        cols.push(json!({"name": "Shard", "type": "string", "format": "",
            "description": "The shard that holds the object (the federation's own: empty).",
            "priority": 0}));
    }
    if let Some(rows) = table["rows"].as_array_mut() {
        for (row, obj) in rows.iter_mut().zip(objects) {
            let shard = obj["metadata"]["labels"][SHARD_LABEL]
                .as_str()
                .unwrap_or_default();
            if let Some(cells) = row["cells"].as_array_mut() {
                cells.push(json!(shard));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composite_versions_round_trip_and_refuse_plain_ones() {
        let mut c = Composite::default();
        c.0.insert("shard-1".into(), "c.40.41".into());
        c.0.insert(LOCAL.into(), "12".into());
        c.0.insert("shard-0".into(), "812".into());
        let s = c.to_string();
        assert_eq!(s, "f..=12;shard-0=812;shard-1=c.40.41");
        assert_eq!(Composite::parse(&s), Some(c));
        assert_eq!(Composite::parse("f."), Some(Composite::default()));
        assert_eq!(Composite::parse("812"), None);
        assert_eq!(Composite::parse("f.shard-0"), None);
        assert_eq!(Composite::parse("f.shard-0="), None);
    }

    #[test]
    fn continue_tokens_round_trip_and_garbage_is_refused() {
        let c = Continue {
            rv: "f.shard-0=5".into(),
            at: "shard-1".into(),
            token: Some("abc".into()),
        };
        assert_eq!(Continue::decode(&c.encode()).expect("decodes"), c);
        let e = Continue::decode("not-a-token").expect_err("refused");
        assert_eq!(e.code, 400);
    }

    #[test]
    fn a_selector_on_the_shard_label_is_split_off() {
        let sel: LabelSelector = "app=web,tessera.io/shard in (shard-0,shard-2)"
            .parse()
            .expect("selector");
        let (rest, on_shard) = split_selector(Some(&sel));
        assert_eq!(rest.map(|s| s.to_string()).as_deref(), Some("app=web"));
        assert_eq!(on_shard.len(), 1);
        assert!(on_shard[0].matches(Some("shard-2")));
        assert!(!on_shard[0].matches(Some("shard-1")));
        // The federation's own objects have no shard label.
        assert!(!on_shard[0].matches(None));
        let only: LabelSelector = "tessera.io/shard=shard-1".parse().expect("selector");
        let (rest, on_shard) = split_selector(Some(&only));
        assert!(rest.is_none());
        assert_eq!(on_shard.len(), 1);
    }

    #[test]
    fn labels_are_added_to_shard_objects_only() {
        let mut o = json!({"metadata": {"name": "p"}});
        label(&mut o, "shard-3");
        assert_eq!(o["metadata"]["labels"][SHARD_LABEL], "shard-3");
        let mut local = json!({"metadata": {"name": "e", "labels": {"a": "b"}}});
        label(&mut local, LOCAL);
        assert_eq!(local["metadata"]["labels"], json!({"a": "b"}));
    }
}
