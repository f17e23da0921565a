//! RBAC's PolicyRules: what one grants (`allows`), and whether one set of rules grants all
//! another does (`covers`, the escalation check), with Kubernetes' wildcard semantics.

use serde_json::Value;

/// What a request asks, as RBAC sees it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Attributes<'a> {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`,
    /// or a special verb (`bind`, `escalate`, `impersonate`).
    pub verb: &'a str,
    /// The API group ("" for core).
    pub group: &'a str,
    /// The plural resource; empty for a non-resource request.
    pub resource: &'a str,
    /// The subresource, or "".
    pub subresource: &'a str,
    /// The object's name, or "".
    pub name: &'a str,
    /// The namespace, or "" at the cluster scope.
    pub namespace: &'a str,
    /// For a non-resource request: its path.
    pub path: &'a str,
}

impl Attributes<'_> {
    fn is_resource(&self) -> bool {
        !self.resource.is_empty()
    }
}

/// One PolicyRule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    /// Verbs (`*` for all).
    pub verbs: Vec<String>,
    /// API groups (`*` for all, "" for core).
    pub api_groups: Vec<String>,
    /// Resources (`*`, `pods`, `pods/log`, `*/scale`).
    pub resources: Vec<String>,
    /// Object names the rule is limited to (none: every name).
    pub resource_names: Vec<String>,
    /// Non-resource paths (`/healthz`, `/api/*`, `*`).
    pub non_resource_urls: Vec<String>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

fn has(set: &[String], s: &str) -> bool {
    set.iter().any(|x| x == s)
}

fn wild(set: &[String]) -> bool {
    has(set, "*")
}

impl Rule {
    /// A rule from its JSON (`rules[i]` of a Role or ClusterRole).
    pub fn from_json(v: &Value) -> Rule {
        Rule {
            verbs: strings(&v["verbs"]),
            api_groups: strings(&v["apiGroups"]),
            resources: strings(&v["resources"]),
            resource_names: strings(&v["resourceNames"]),
            non_resource_urls: strings(&v["nonResourceURLs"]),
        }
    }

    /// The rule as JSON, as a rules review reports it.
    pub fn to_json(&self) -> Value {
        let mut out = serde_json::Map::new();
        out.insert("verbs".into(), self.verbs.clone().into());
        if self.non_resource_urls.is_empty() {
            out.insert("apiGroups".into(), self.api_groups.clone().into());
            out.insert("resources".into(), self.resources.clone().into());
            if !self.resource_names.is_empty() {
                out.insert("resourceNames".into(), self.resource_names.clone().into());
            }
        } else {
            out.insert(
                "nonResourceURLs".into(),
                self.non_resource_urls.clone().into(),
            );
        }
        Value::Object(out)
    }

    /// A resource rule.
    pub fn resource(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Rule {
        let own = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect();
        Rule {
            verbs: own(verbs),
            api_groups: own(groups),
            resources: own(resources),
            ..Rule::default()
        }
    }

    /// The same rule, limited to these names.
    pub fn named(mut self, names: &[&str]) -> Rule {
        self.resource_names = names.iter().map(|x| (*x).to_owned()).collect();
        self
    }

    /// A non-resource rule.
    pub fn paths(paths: &[&str], verbs: &[&str]) -> Rule {
        Rule {
            verbs: verbs.iter().map(|x| (*x).to_owned()).collect(),
            non_resource_urls: paths.iter().map(|x| (*x).to_owned()).collect(),
            ..Rule::default()
        }
    }

    /// Whether the rule grants `a` (Kubernetes' `RuleAllows`).
    pub fn allows(&self, a: &Attributes<'_>) -> bool {
        if !(wild(&self.verbs) || has(&self.verbs, a.verb)) {
            return false;
        }
        if !a.is_resource() {
            return self
                .non_resource_urls
                .iter()
                .any(|u| url_matches(u, a.path));
        }
        if !(wild(&self.api_groups) || has(&self.api_groups, a.group)) {
            return false;
        }
        let resource_ok = self.resources.iter().any(|r| {
            if r == "*" {
                return true;
            }
            if a.subresource.is_empty() {
                return r == a.resource;
            }
            r.strip_prefix(a.resource)
                .and_then(|rest| rest.strip_prefix('/'))
                .is_some_and(|sub| sub == a.subresource)
                || r.strip_prefix("*/") == Some(a.subresource)
        });
        resource_ok && (self.resource_names.is_empty() || has(&self.resource_names, a.name))
    }
}

fn url_matches(rule: &str, path: &str) -> bool {
    rule == "*"
        || rule == path
        || rule
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

/// Whether `owner` grants everything `servant` does (Kubernetes' `Covers`, what stops a
/// caller from writing a Role or a binding that grants more than it holds): each rule of
/// `servant`, taken apart into one verb, group, resource and name at a time, must be granted
/// by one rule of `owner`. A wildcard is covered only by a wildcard. The rules not covered
/// are returned (empty: covered).
pub fn uncovered(owner: &[Rule], servant: &[Rule]) -> Vec<Rule> {
    let mut out = Vec::new();
    for rule in servant {
        for atom in atoms(rule) {
            if !owner.iter().any(|o| covers_atom(o, &atom)) {
                out.push(atom);
            }
        }
    }
    out
}

/// A rule taken apart: one verb, one group, one resource, at most one name (or one path).
fn atoms(rule: &Rule) -> Vec<Rule> {
    let mut out = Vec::new();
    for verb in &rule.verbs {
        for url in &rule.non_resource_urls {
            out.push(Rule::paths(&[url], &[verb]));
        }
        for group in &rule.api_groups {
            for resource in &rule.resources {
                let base = Rule::resource(&[group], &[resource], &[verb]);
                if rule.resource_names.is_empty() {
                    out.push(base);
                } else {
                    for name in &rule.resource_names {
                        out.push(base.clone().named(&[name]));
                    }
                }
            }
        }
    }
    out
}

fn covers_atom(owner: &Rule, atom: &Rule) -> bool {
    let one = |v: &[String]| v.first().cloned().unwrap_or_default();
    let verb = one(&atom.verbs);
    if !(wild(&owner.verbs) || has(&owner.verbs, &verb)) {
        return false;
    }
    if let Some(url) = atom.non_resource_urls.first() {
        return owner.non_resource_urls.iter().any(|o| {
            o == "*"
                || o == url
                || o.strip_suffix('*').is_some_and(|p| {
                    url.strip_suffix('*').unwrap_or(url).starts_with(p) || url.starts_with(p)
                })
        });
    }
    let group = one(&atom.api_groups);
    if !(wild(&owner.api_groups) || has(&owner.api_groups, &group)) {
        return false;
    }
    let resource = one(&atom.resources);
    let resource_ok = wild(&owner.resources)
        || has(&owner.resources, &resource)
        || resource
            .split_once('/')
            .is_some_and(|(_, sub)| has(&owner.resources, &format!("*/{sub}")));
    if !resource_ok {
        return false;
    }
    match atom.resource_names.first() {
        _ if owner.resource_names.is_empty() => true,
        Some(name) => has(&owner.resource_names, name),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn attrs<'a>(verb: &'a str, group: &'a str, resource: &'a str) -> Attributes<'a> {
        Attributes {
            verb,
            group,
            resource,
            ..Attributes::default()
        }
    }

    #[test]
    fn a_rule_grants_what_it_names_and_nothing_else() {
        let r = Rule::resource(&[""], &["pods", "pods/log"], &["get", "list"]);
        assert!(r.allows(&attrs("get", "", "pods")));
        assert!(r.allows(&attrs("list", "", "pods")));
        assert!(!r.allows(&attrs("delete", "", "pods")));
        assert!(!r.allows(&attrs("get", "apps", "pods")));
        assert!(!r.allows(&attrs("get", "", "secrets")));
        let log = Attributes {
            subresource: "log",
            ..attrs("get", "", "pods")
        };
        assert!(r.allows(&log));
        let status = Attributes {
            subresource: "status",
            ..attrs("get", "", "pods")
        };
        assert!(!r.allows(&status), "pods does not grant pods/status");
        let scale = Rule::resource(&["apps"], &["*/scale"], &["*"]);
        let dep_scale = Attributes {
            subresource: "scale",
            ..attrs("update", "apps", "deployments")
        };
        assert!(scale.allows(&dep_scale));
        assert!(!scale.allows(&attrs("update", "apps", "deployments")));
        let named = Rule::resource(&[""], &["configmaps"], &["get"]).named(&["a"]);
        let get = |name| Attributes {
            name,
            ..attrs("get", "", "configmaps")
        };
        assert!(named.allows(&get("a")));
        assert!(!named.allows(&get("b")));
        assert!(!named.allows(&get("")), "a list is not a named get");
    }

    #[test]
    fn non_resource_rules_match_paths_and_prefixes() {
        let r = Rule::paths(&["/healthz", "/apis/*"], &["get"]);
        let path = |path| Attributes {
            verb: "get",
            path,
            ..Attributes::default()
        };
        assert!(r.allows(&path("/healthz")));
        assert!(r.allows(&path("/apis/apps/v1")));
        assert!(!r.allows(&path("/api")));
        assert!(
            !r.allows(&attrs("get", "", "pods")),
            "paths grant no resource"
        );
        assert!(
            !Rule::resource(&["*"], &["*"], &["*"]).allows(&path("/healthz")),
            "resources grant no path"
        );
    }

    #[test]
    fn covers_follows_kubernetes_wildcards() {
        let all = vec![Rule::resource(&["*"], &["*"], &["*"])];
        let pods = vec![Rule::resource(&[""], &["pods"], &["get", "list"])];
        assert!(uncovered(&all, &pods).is_empty());
        assert_eq!(uncovered(&pods, &all).len(), 1, "only * covers *");
        let get = vec![Rule::resource(&[""], &["pods"], &["get"])];
        assert_eq!(
            uncovered(&get, &pods),
            vec![Rule::resource(&[""], &["pods"], &["list"])]
        );
        let subs = vec![Rule::resource(&["apps"], &["*/scale"], &["get"])];
        assert!(
            uncovered(
                &subs,
                &[Rule::resource(&["apps"], &["deployments/scale"], &["get"])]
            )
            .is_empty()
        );
        let named = vec![Rule::resource(&[""], &["pods"], &["get"]).named(&["a"])];
        assert!(
            uncovered(
                &named,
                &[Rule::resource(&[""], &["pods"], &["get"]).named(&["a"])]
            )
            .is_empty()
        );
        assert_eq!(
            uncovered(&named, &get).len(),
            1,
            "a name does not cover all names"
        );
        let paths = vec![Rule::paths(&["/apis/*"], &["get"])];
        assert!(uncovered(&paths, &[Rule::paths(&["/apis/apps"], &["get"])]).is_empty());
        assert_eq!(
            uncovered(&paths, &[Rule::paths(&["/api"], &["get"])]).len(),
            1
        );
    }

    fn rule_strategy() -> impl Strategy<Value = Rule> {
        let verbs = prop::sample::subsequence(vec!["get", "list", "create", "delete", "*"], 1..3);
        let groups = prop::sample::subsequence(vec!["", "apps", "*"], 1..2);
        let resources = prop::sample::subsequence(
            vec!["pods", "pods/log", "deployments", "*/scale", "*"],
            1..3,
        );
        let names = prop::sample::subsequence(vec!["a", "b"], 0..2);
        (verbs, groups, resources, names)
            .prop_map(|(v, g, r, n)| Rule::resource(&g, &r, &v).named(&n))
    }

    proptest! {
        /// Whatever `covers` says is covered, `allows` agrees on: no request a servant rule
        /// grants is refused by the owner's rules (the escalation check never lets a caller
        /// grant what it does not hold).
        #[test]
        fn covered_rules_grant_nothing_more(owner in prop::collection::vec(rule_strategy(), 1..4),
                                            servant in rule_strategy()) {
            if uncovered(&owner, std::slice::from_ref(&servant)).is_empty() {
                for verb in ["get", "list", "create", "delete", "patch"] {
                    for group in ["", "apps", "batch"] {
                        for (resource, sub) in [("pods", ""), ("pods", "log"), ("deployments", "scale"), ("deployments", ""), ("secrets", "")] {
                            for name in ["", "a", "b", "c"] {
                                let a = Attributes { verb, group, resource, subresource: sub, name, ..Attributes::default() };
                                if servant.allows(&a) {
                                    prop_assert!(owner.iter().any(|o| o.allows(&a)), "{a:?} granted by {servant:?} but not by {owner:?}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
