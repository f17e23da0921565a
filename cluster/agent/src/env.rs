//! A container's environment, resolved as the kubelet resolves it: `HOSTNAME`, then `envFrom` (ConfigMaps
//! and Secrets, with their prefix) first, then `env` in order — literal values with `$(VAR)`
//! references to earlier variables expanded (`$$` escapes), and `valueFrom` a field of the
//! pod (the downward API), a ConfigMap key or a Secret key. A reference that cannot be
//! resolved and is not `optional` keeps the container from starting
//! (`CreateContainerConfigError` with the reason).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::Value;
use tessera_client::client::Client;

/// Name and value pairs, in order.
pub type Env = Vec<(String, String)>;

/// `s` with `$(NAME)` replaced by NAME's value in `env` (unknown names are left as they
/// are; `$$` is a literal `$`), as Kubernetes expands env values, commands and args.
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('(')
            && let Some(end) = tail.find(')')
        {
            let name = &tail[..end];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A field of the pod for `fieldRef.fieldPath`.
fn pod_field(pod: &Value, path: &str) -> Option<String> {
    let indexed = |prefix: &str, map: &str| {
        let key = path
            .strip_prefix(prefix)?
            .strip_prefix("['")?
            .strip_suffix("']")?;
        pod["metadata"][map][key].as_str().map(str::to_owned)
    };
    let at = |p: &str| pod.pointer(p).and_then(Value::as_str).map(str::to_owned);
    match path {
        "metadata.name" => at("/metadata/name"),
        "metadata.namespace" => at("/metadata/namespace"),
        "metadata.uid" => at("/metadata/uid"),
        "spec.nodeName" => at("/spec/nodeName"),
        "spec.serviceAccountName" => at("/spec/serviceAccountName").or(Some("default".into())),
        "status.podIP" | "status.hostIP" => Some("127.0.0.1".into()),
        "status.podIPs" | "status.hostIPs" => Some("127.0.0.1".into()),
        p if p.starts_with("metadata.labels") => indexed("metadata.labels", "labels"),
        p if p.starts_with("metadata.annotations") => {
            indexed("metadata.annotations", "annotations")
        }
        _ => None,
    }
}

/// Reads the keys of ConfigMap (or Secret, decoded) `name` in `ns`, as text.
async fn keys_of(
    client: &Arc<dyn Client>,
    secret: bool,
    ns: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, String>>, String> {
    Ok(crate::isolation::read_keys(client, secret, ns, name)
        .await?
        .map(|keys| {
            keys.into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                .collect()
        }))
}

/// The environment of container `c` of `pod`.
pub async fn resolve(client: &Arc<dyn Client>, pod: &Pod, c: &Container) -> Result<Env, String> {
    let pod_value = serde_json::to_value(pod).unwrap_or(Value::Null);
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    // What a container runtime sets: the pod's host name.
    let hostname = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default();
    let mut env: Env = vec![("HOSTNAME".into(), hostname)];
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let (secret, name, optional) = match (&from.config_map_ref, &from.secret_ref) {
            (Some(cm), _) => (false, cm.name.as_str(), cm.optional.unwrap_or(false)),
            (None, Some(s)) => (true, s.name.as_str(), s.optional.unwrap_or(false)),
            (None, None) => continue,
        };
        match keys_of(client, secret, ns, name).await? {
            Some(keys) => env.extend(keys.into_iter().map(|(k, v)| (format!("{prefix}{k}"), v))),
            None if optional => {}
            None => {
                return Err(format!(
                    "{} \"{name}\" not found",
                    if secret { "secret" } else { "configmap" }
                ));
            }
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (_, Some(from)) => {
                if let Some(f) = &from.field_ref {
                    pod_field(&pod_value, &f.field_path).ok_or_else(|| {
                        format!(
                            "env {}: fieldRef {:?} is not a field the process runtime provides",
                            e.name, f.field_path
                        )
                    })?
                } else if let Some((secret, name, key, optional)) = from
                    .config_map_key_ref
                    .as_ref()
                    .map(|r| (false, &r.name, &r.key, r.optional))
                    .or_else(|| {
                        from.secret_key_ref
                            .as_ref()
                            .map(|r| (true, &r.name, &r.key, r.optional))
                    })
                {
                    let (kind, what) = if secret {
                        ("Secret", "secret")
                    } else {
                        ("ConfigMap", "configmap")
                    };
                    match keys_of(client, secret, ns, name).await? {
                        Some(keys) if keys.contains_key(key) => keys[key].clone(),
                        _ if optional.unwrap_or(false) => continue,
                        Some(_) => {
                            return Err(format!("couldn't find key {key} in {kind} {ns}/{name}"));
                        }
                        None => return Err(format!("{what} \"{name}\" not found")),
                    }
                } else {
                    return Err(format!(
                        "env {}: resourceFieldRef is not supported by the process runtime",
                        e.name
                    ));
                }
            }
            (Some(v), None) => expand(v, &env),
            (None, None) => String::new(),
        };
        env.push((e.name.clone(), value));
    }
    Ok(env)
}

/// `cmd args` as container `c` would run it: with its environment `env` (only that: the
/// agent's own is not inherited, `PATH` aside) and working directory, no stdin, killed if
/// dropped.
pub fn in_container(
    c: &Container,
    env: &[(String, String)],
    cmd: &str,
    args: &[String],
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(cmd);
    command.args(args);
    with_env(&mut command, env);
    if let Some(d) = &c.working_dir {
        command.current_dir(d);
    }
    command
}

/// Gives `command` the container's environment `env` and nothing of the agent's but `PATH`;
/// no stdin; killed if dropped.
pub fn with_env(command: &mut tokio::process::Command, env: &[(String, String)]) {
    command
        .env_clear()
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    command.envs(env.iter().map(|(k, v)| (k, v)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_expand_like_kubernetes() {
        let env = vec![
            ("A".to_owned(), "one".to_owned()),
            ("B".to_owned(), "two".to_owned()),
        ];
        assert_eq!(expand("$(A)-$(B)", &env), "one-two");
        assert_eq!(expand("$$(A) costs $5", &env), "$(A) costs $5");
        assert_eq!(expand("$(MISSING) stays", &env), "$(MISSING) stays");
        assert_eq!(expand("open $(A", &env), "open $(A");
        assert_eq!(expand("plain", &env), "plain");
    }

    #[test]
    fn pod_fields_of_the_downward_api() {
        let pod = serde_json::json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u",
            "labels": {"app": "web"}, "annotations": {"a/b": "c"}}, "spec": {"nodeName": "n"}});
        assert_eq!(pod_field(&pod, "metadata.name").as_deref(), Some("p"));
        assert_eq!(
            pod_field(&pod, "metadata.labels['app']").as_deref(),
            Some("web")
        );
        assert_eq!(
            pod_field(&pod, "metadata.annotations['a/b']").as_deref(),
            Some("c")
        );
        assert_eq!(pod_field(&pod, "spec.nodeName").as_deref(), Some("n"));
        assert_eq!(
            pod_field(&pod, "status.podIP").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(pod_field(&pod, "metadata.labels['none']"), None);
        assert_eq!(pod_field(&pod, "spec.nothing"), None);
    }
}
