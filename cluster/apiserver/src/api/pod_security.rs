//! Pod Security admission, as Kubernetes has it: a namespace's labels
//! `pod-security.kubernetes.io/enforce|warn|audit` name a level of the Pod Security
//! Standards — `privileged` (anything), `baseline` (no known privilege escalation: no host
//! namespaces, privileged containers, hostPath, host ports, added capabilities beyond the
//! default set, unsafe sysctls, unconfined seccomp/AppArmor, SELinux or /proc changes) or
//! `restricted` (baseline, and: only ephemeral/config volume types, no privilege escalation,
//! non-root, `RuntimeDefault` seccomp, all capabilities dropped). A pod that violates the
//! `enforce` level is refused (403, every violation listed); `warn` answers with a warning;
//! `audit` is logged.
//!
//! Tessera adds the tenancy boundary: in a namespace a Tenant owns, no label can loosen the
//! level beyond the Tenant's `spec.podSecurity` (default `baseline`) — the level enforced is
//! the stricter of the two, and a tenant's own attempt to label its namespace looser is
//! refused. Namespaces no Tenant owns default to `privileged`, as in Kubernetes.

use serde_json::Value;

/// The namespace label prefix.
pub const LABEL_PREFIX: &str = "pod-security.kubernetes.io/";

/// A Pod Security Standards level, least to most restrictive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Unrestricted.
    Privileged,
    /// Prevents known privilege escalations.
    Baseline,
    /// Current pod hardening practice.
    Restricted,
}

impl Level {
    /// The level a label value names.
    pub fn parse(s: &str) -> Option<Level> {
        match s {
            "privileged" => Some(Level::Privileged),
            "baseline" => Some(Level::Baseline),
            "restricted" => Some(Level::Restricted),
            _ => None,
        }
    }

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

/// What a Tenant's namespaces get when its `spec.podSecurity` is unset.
pub const TENANT_DEFAULT: Level = Level::Baseline;

/// The capabilities baseline lets a container add (the container runtimes' default set).
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Sysctls baseline allows (namespaced and safe).
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// Volume types restricted allows.
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// The levels a namespace's labels ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Refused above this.
    pub enforce: Level,
    /// Warned about above this.
    pub warn: Level,
    /// Logged above this.
    pub audit: Level,
}

impl Policy {
    /// The policy of a namespace with `labels`, owned by a Tenant allowing at most
    /// `tenant_max` (`None`: no Tenant owns it). An invalid label value counts as
    /// `restricted`, as Kubernetes evaluates it.
    pub fn of(labels: &Value, tenant_max: Option<Level>) -> Policy {
        let default = tenant_max.unwrap_or(Level::Privileged);
        let level = |mode: &str| {
            let asked = labels[format!("{LABEL_PREFIX}{mode}")]
                .as_str()
                .map(|v| Level::parse(v).unwrap_or(Level::Restricted));
            let asked = asked.unwrap_or(default);
            // A Tenant's namespaces are never looser than the Tenant allows.
            tenant_max.map_or(asked, |max| asked.max(max))
        };
        Policy {
            enforce: level("enforce"),
            warn: level("warn"),
            audit: level("audit"),
        }
    }
}

/// A label on a Tenant's namespace that asks for a level looser than the Tenant allows:
/// the label and its value.
pub fn looser_label(labels: &Value, tenant_max: Level) -> Option<(String, String)> {
    ["enforce", "warn", "audit"].into_iter().find_map(|mode| {
        let key = format!("{LABEL_PREFIX}{mode}");
        let v = labels[&key].as_str()?;
        let level = Level::parse(v)?;
        (level < tenant_max).then(|| (key, v.to_owned()))
    })
}

/// Every way pod spec `spec` breaks `level`, in Kubernetes' words (`host namespaces
/// (hostNetwork=true)`); empty if it meets it.
pub fn violations(spec: &Value, level: Level) -> Vec<String> {
    let mut out = Vec::new();
    if level == Level::Privileged {
        return out;
    }
    let containers: Vec<(&str, &Value)> = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|k| spec[*k].as_array().into_iter().flatten())
        .map(|c| (c["name"].as_str().unwrap_or(""), c))
        .collect();
    let quoted = |names: &[&str]| {
        names
            .iter()
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let plural = |n: usize| if n == 1 { "container" } else { "containers" };
    let psc = &spec["securityContext"];

    // Host namespaces.
    let host: Vec<String> = ["hostNetwork", "hostPID", "hostIPC"]
        .iter()
        .filter(|k| spec[**k] == true)
        .map(|k| format!("{k}=true"))
        .collect();
    if !host.is_empty() {
        out.push(format!("host namespaces ({})", host.join(", ")));
    }
    // Privileged containers.
    let privileged: Vec<&str> = containers
        .iter()
        .filter(|(_, c)| c["securityContext"]["privileged"] == true)
        .map(|(n, _)| *n)
        .collect();
    if !privileged.is_empty() {
        out.push(format!(
            "privileged ({} {} must not set securityContext.privileged=true)",
            plural(privileged.len()),
            quoted(&privileged)
        ));
    }
    // Capabilities beyond the default set.
    let mut added: Vec<String> = Vec::new();
    let mut adders: Vec<&str> = Vec::new();
    for (n, c) in &containers {
        let extra: Vec<String> = c["securityContext"]["capabilities"]["add"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|cap| !BASELINE_CAPABILITIES.contains(cap))
            .map(|cap| format!("{cap:?}"))
            .collect();
        if !extra.is_empty() {
            adders.push(n);
            added.extend(extra);
        }
    }
    if !adders.is_empty() {
        out.push(format!(
            "non-default capabilities ({} {} must not include {} in securityContext.capabilities.add)",
            plural(adders.len()),
            quoted(&adders),
            added.join(", ")
        ));
    }
    // hostPath volumes.
    let host_paths: Vec<&str> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["hostPath"].is_object())
        .map(|v| v["name"].as_str().unwrap_or(""))
        .collect();
    if !host_paths.is_empty() {
        out.push(format!(
            "hostPath volumes (volume{} {})",
            if host_paths.len() == 1 { "" } else { "s" },
            quoted(&host_paths)
        ));
    }
    // Host ports.
    let mut ports: Vec<String> = Vec::new();
    let mut porters: Vec<&str> = Vec::new();
    for (n, c) in &containers {
        let hp: Vec<String> = c["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["hostPort"].as_i64())
            .filter(|p| *p != 0)
            .map(|p| p.to_string())
            .collect();
        if !hp.is_empty() {
            porters.push(n);
            ports.extend(hp);
        }
    }
    if !porters.is_empty() {
        out.push(format!(
            "hostPort ({} {} {} hostPort {})",
            plural(porters.len()),
            quoted(&porters),
            if porters.len() == 1 { "uses" } else { "use" },
            ports.join(", ")
        ));
    }
    // Seccomp, AppArmor, SELinux, /proc mount, sysctls.
    let unconfined = |sc: &Value| sc["seccompProfile"]["type"] == "Unconfined";
    if unconfined(psc)
        || containers
            .iter()
            .any(|(_, c)| unconfined(&c["securityContext"]))
    {
        out.push("seccompProfile (seccompProfile.type must not be \"Unconfined\")".into());
    }
    if psc["appArmorProfile"]["type"] == "Unconfined"
        || containers
            .iter()
            .any(|(_, c)| c["securityContext"]["appArmorProfile"]["type"] == "Unconfined")
    {
        out.push("appArmorProfile (appArmorProfile.type must not be \"Unconfined\")".into());
    }
    let selinux_bad = |sc: &Value| {
        let o = &sc["seLinuxOptions"];
        let t = o["type"].as_str().unwrap_or("");
        !o["user"].is_null()
            || !o["role"].is_null()
            || !matches!(
                t,
                "" | "container_t" | "container_init_t" | "container_kvm_t"
            )
    };
    if selinux_bad(psc)
        || containers
            .iter()
            .any(|(_, c)| selinux_bad(&c["securityContext"]))
    {
        out.push(
            "seLinuxOptions (seLinuxOptions may only set type to container_t, container_init_t or container_kvm_t)"
                .into(),
        );
    }
    let unmasked: Vec<&str> = containers
        .iter()
        .filter(|(_, c)| {
            c["securityContext"]["procMount"]
                .as_str()
                .is_some_and(|m| m != "Default")
        })
        .map(|(n, _)| *n)
        .collect();
    if !unmasked.is_empty() {
        out.push(format!(
            "procMount ({} {} must not set securityContext.procMount to \"Unmasked\")",
            plural(unmasked.len()),
            quoted(&unmasked)
        ));
    }
    let sysctls: Vec<&str> = psc["sysctls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["name"].as_str())
        .filter(|n| !SAFE_SYSCTLS.contains(n))
        .collect();
    if !sysctls.is_empty() {
        out.push(format!("forbidden sysctls ({})", sysctls.join(", ")));
    }
    if level == Level::Baseline {
        return out;
    }

    // Restricted.
    let bad_volumes: Vec<String> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let kind = v.as_object()?.keys().find(|k| *k != "name")?.to_owned();
            (!RESTRICTED_VOLUMES.contains(&kind.as_str())).then(|| {
                format!(
                    "{:?} uses restricted volume type {kind:?}",
                    v["name"].as_str().unwrap_or("")
                )
            })
        })
        .collect();
    if !bad_volumes.is_empty() {
        out.push(format!(
            "restricted volume types ({})",
            bad_volumes.join(", ")
        ));
    }
    let escalating: Vec<&str> = containers
        .iter()
        .filter(|(_, c)| c["securityContext"]["allowPrivilegeEscalation"] != false)
        .map(|(n, _)| *n)
        .collect();
    if !escalating.is_empty() {
        out.push(format!(
            "allowPrivilegeEscalation != false ({} {} must set securityContext.allowPrivilegeEscalation=false)",
            plural(escalating.len()),
            quoted(&escalating)
        ));
    }
    let pod_non_root = psc["runAsNonRoot"] == true;
    let may_be_root: Vec<&str> = containers
        .iter()
        .filter(|(_, c)| {
            let v = &c["securityContext"]["runAsNonRoot"];
            v == false || (v.is_null() && !pod_non_root)
        })
        .map(|(n, _)| *n)
        .collect();
    if psc["runAsNonRoot"] == false || !may_be_root.is_empty() {
        out.push(format!(
            "runAsNonRoot != true (pod or {} {} must set securityContext.runAsNonRoot=true)",
            plural(may_be_root.len().max(1)),
            quoted(&may_be_root)
        ));
    }
    let root_uid: Vec<&str> = containers
        .iter()
        .filter(|(_, c)| c["securityContext"]["runAsUser"] == 0)
        .map(|(n, _)| *n)
        .collect();
    if psc["runAsUser"] == 0 || !root_uid.is_empty() {
        out.push("runAsUser=0 (pod and containers must not set runAsUser=0)".into());
    }
    let seccomp_ok = |sc: &Value| {
        matches!(
            sc["seccompProfile"]["type"].as_str(),
            Some("RuntimeDefault" | "Localhost")
        )
    };
    let pod_seccomp = seccomp_ok(psc);
    let no_seccomp: Vec<&str> = containers
        .iter()
        .filter(|(_, c)| {
            let t = &c["securityContext"]["seccompProfile"]["type"];
            if t.is_null() {
                !pod_seccomp
            } else {
                !seccomp_ok(&c["securityContext"])
            }
        })
        .map(|(n, _)| *n)
        .collect();
    if !no_seccomp.is_empty() {
        out.push(format!(
            "seccompProfile (pod or {} {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")",
            plural(no_seccomp.len()),
            quoted(&no_seccomp)
        ));
    }
    let undropped: Vec<&str> = containers
        .iter()
        .filter(|(_, c)| {
            !c["securityContext"]["capabilities"]["drop"]
                .as_array()
                .is_some_and(|d| d.iter().any(|x| x == "ALL"))
        })
        .map(|(n, _)| *n)
        .collect();
    if !undropped.is_empty() {
        out.push(format!(
            "unrestricted capabilities ({} {} must set securityContext.capabilities.drop=[\"ALL\"])",
            plural(undropped.len()),
            quoted(&undropped)
        ));
    }
    let adds_more: Vec<&str> = containers
        .iter()
        .filter(|(_, c)| {
            c["securityContext"]["capabilities"]["add"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x != "NET_BIND_SERVICE"))
        })
        .map(|(n, _)| *n)
        .collect();
    if !adds_more.is_empty() {
        out.push(format!(
            "unrestricted capabilities ({} {} must not add capabilities beyond NET_BIND_SERVICE)",
            plural(adds_more.len()),
            quoted(&adds_more)
        ));
    }
    out
}

/// The message of a refusal (or warning) for `level`'s `violations`, as Kubernetes words it.
pub fn message(level: Level, violations: &[String]) -> String {
    format!(
        "violates PodSecurity \"{}:latest\": {}",
        level.as_str(),
        violations.join(", ")
    )
}

/// The pod spec inside a workload's template (`spec.template.spec`, or a CronJob's
/// `spec.jobTemplate.spec.template.spec`), for warnings on workloads.
pub fn template_spec<'a>(kind: &str, obj: &'a Value) -> Option<&'a Value> {
    let spec = match kind {
        "Pod" => &obj["spec"],
        "CronJob" => &obj["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        "Deployment"
        | "ReplicaSet"
        | "StatefulSet"
        | "DaemonSet"
        | "Job"
        | "ReplicationController"
        | "PodTemplate" => {
            if kind == "PodTemplate" {
                &obj["template"]["spec"]
            } else {
                &obj["spec"]["template"]["spec"]
            }
        }
        _ => return None,
    };
    spec.is_object().then_some(spec)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn baseline_refuses_the_escape_pod() {
        let spec = json!({"hostNetwork": true, "hostPID": true,
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}],
                "securityContext": {"privileged": true, "capabilities": {"add": ["SYS_ADMIN", "CHOWN"]}}}]});
        let v = violations(&spec, Level::Baseline);
        assert_eq!(
            v,
            vec![
                "host namespaces (hostNetwork=true, hostPID=true)".to_owned(),
                "privileged (container \"c\" must not set securityContext.privileged=true)".into(),
                "non-default capabilities (container \"c\" must not include \"SYS_ADMIN\" in securityContext.capabilities.add)".into(),
                "hostPath volumes (volume \"root\")".into(),
                "hostPort (container \"c\" uses hostPort 80)".into(),
            ]
        );
        assert!(violations(&spec, Level::Privileged).is_empty());
        let plain = json!({"containers": [{"name": "c", "image": "x"}],
            "volumes": [{"name": "v", "emptyDir": {}}]});
        assert!(violations(&plain, Level::Baseline).is_empty());
    }

    #[test]
    fn restricted_wants_hardening() {
        let plain = json!({"containers": [{"name": "c"}]});
        let v = violations(&plain, Level::Restricted);
        assert_eq!(v.len(), 4, "{v:?}");
        assert!(v[0].starts_with("allowPrivilegeEscalation != false"));
        assert!(v[1].starts_with("runAsNonRoot != true"));
        assert!(v[2].starts_with("seccompProfile"));
        assert!(v[3].starts_with("unrestricted capabilities"));
        let hardened = json!({"securityContext": {"runAsNonRoot": true,
                "seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": [{"name": "cfg", "configMap": {"name": "x"}}],
            "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}]});
        assert!(violations(&hardened, Level::Restricted).is_empty());
        let nfs = json!({"volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}],
            "containers": []});
        assert_eq!(
            violations(&nfs, Level::Restricted),
            vec!["restricted volume types (\"n\" uses restricted volume type \"nfs\")".to_owned()]
        );
    }

    #[test]
    fn a_tenant_bounds_its_namespaces() {
        let labels = json!({"pod-security.kubernetes.io/enforce": "privileged",
            "pod-security.kubernetes.io/warn": "restricted"});
        let p = Policy::of(&labels, Some(Level::Baseline));
        assert_eq!(p.enforce, Level::Baseline, "never looser than the Tenant");
        assert_eq!(p.warn, Level::Restricted, "stricter is fine");
        assert_eq!(p.audit, Level::Baseline, "unlabelled: the Tenant's level");
        let admin = Policy::of(&json!({}), None);
        assert_eq!(admin.enforce, Level::Privileged);
        let typo = Policy::of(
            &json!({"pod-security.kubernetes.io/enforce": "basline"}),
            None,
        );
        assert_eq!(
            typo.enforce,
            Level::Restricted,
            "an invalid level is the strictest"
        );
        assert_eq!(
            looser_label(&labels, Level::Baseline),
            Some((
                "pod-security.kubernetes.io/enforce".to_owned(),
                "privileged".to_owned()
            ))
        );
        assert_eq!(looser_label(&labels, Level::Privileged), None);
    }
}
