//! The agent's side of the sandbox ([`crate::sandbox`]): per pod, a range of host ids no
//! other pod on the host holds, a private directory with its volumes (`emptyDir`,
//! `configMap`, `secret`, `hostPath`), and per container the identity and mounts its
//! `securityContext` and `volumeMounts` ask for.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use k8s_openapi::api::core::v1::{Container, KeyToPath, Pod, PodSecurityContext, SecurityContext};
use serde_json::Value;
use tessera_client::client::Client;
use tessera_client::request::find_resource;

use crate::sandbox::{Bind, Identity, Ids, Launcher, Seccomp};

/// Host ids per pod (as Kubernetes gives a pod with `hostUsers: false`).
pub const IDS_PER_POD: u32 = 65536;
/// The first host id handed to pods: far above the ids of the host's own users.
const FIRST_ID: u32 = 1 << 30;
/// How many pods can hold ids on one host at once.
const SLOTS: u32 = 16384;

/// How a process node runs containers.
#[derive(Clone, Debug)]
pub enum Isolation {
    /// In the sandbox, started through this launcher (the agent must be root).
    Sandbox(Launcher),
    /// As plain child processes of the agent, with its rights: for trusted code on a
    /// developer's machine only (`--process-isolation=off`).
    Off,
}

/// Whether a pod runs outside the sandbox: `privileged` containers (admitted only where the
/// namespace's Pod Security level is `privileged`).
pub fn privileged(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| {
                c.security_context
                    .as_ref()
                    .and_then(|sc| sc.privileged)
                    .unwrap_or(false)
            })
    })
}

/// A pod's claim on a range of host ids: a directory made atomically under `dir` (shared by
/// every agent on the host), holding who owns it; released on drop.
pub struct IdLease {
    path: PathBuf,
    /// The range.
    pub ids: Ids,
}

impl Drop for IdLease {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

impl IdLease {
    /// Takes a free range for pod `uid` of node `node`, starting the search at a slot
    /// derived from the uid (so restarts tend to reuse a pod's range).
    pub fn take(dir: &Path, node: &str, uid: &str) -> Result<IdLease, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let start = uid
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
            % SLOTS;
        for i in 0..SLOTS {
            let slot = (start + i) % SLOTS;
            let path = dir.join(slot.to_string());
            match std::fs::create_dir(&path) {
                Ok(()) => {
                    std::fs::write(path.join("owner"), format!("{node} {uid}\n"))
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                    return Ok(IdLease {
                        path,
                        ids: Ids {
                            base: FIRST_ID + slot * IDS_PER_POD,
                            count: IDS_PER_POD,
                        },
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(format!("{}: {e}", path.display())),
            }
        }
        Err(format!("all {SLOTS} id ranges of this host are taken"))
    }

    /// Releases the ranges node `node` held before it restarted. An agent killed outright
    /// (SIGKILL, a crash) leaves its containers running under their ranges: those processes
    /// are killed first, and a range is released only once nothing runs under it — never
    /// handed to a new pod (perhaps another tenant's) while an old one still holds its ids.
    /// Returns the processes killed.
    pub fn release_stale(dir: &Path, node: &str) -> usize {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return 0;
        };
        let mut killed = 0;
        for e in entries.flatten() {
            let owner = std::fs::read_to_string(e.path().join("owner")).unwrap_or_default();
            if owner.split_whitespace().next() != Some(node) {
                continue;
            }
            let Some(slot) = e
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|s| *s < SLOTS)
            else {
                continue;
            };
            let ids = Ids {
                base: FIRST_ID + slot * IDS_PER_POD,
                count: IDS_PER_POD,
            };
            match kill_leftovers(Path::new("/proc"), ids) {
                Ok(n) => {
                    if n > 0 {
                        tracing::warn!(%node, pod = owner.split_whitespace().nth(1).unwrap_or_default(),
                            processes = n, "killed what a previous run of this node left running");
                    }
                    killed += n;
                    let _ = std::fs::remove_dir_all(e.path());
                }
                Err(left) => tracing::error!(%node, range = ids.base, processes = ?left,
                    "processes of a previous run survive SIGKILL; their id range stays held"),
            }
        }
        killed
    }
}

/// The live processes under `proc` (a procfs) any of whose user ids (real, effective, saved,
/// filesystem) lies in `ids`. Zombies are left out: they run nothing and hold nothing.
pub fn processes_in(proc: &Path, ids: Ids) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let mut zombie = false;
            let mut inside = false;
            for line in status.lines() {
                if let Some(state) = line.strip_prefix("State:") {
                    zombie = matches!(state.trim_start().chars().next(), Some('Z' | 'X'));
                } else if let Some(uids) = line.strip_prefix("Uid:") {
                    inside = uids
                        .split_whitespace()
                        .filter_map(|n| n.parse::<u32>().ok())
                        .any(|n| n >= ids.base && n - ids.base < ids.count);
                }
            }
            (inside && !zombie).then_some(pid)
        })
        .collect()
}

/// Kills (SIGKILL, repeatedly: a process may fork while it is being killed) every process
/// in `ids`; the number killed, or the ones still alive after 2 s.
fn kill_leftovers(proc: &Path, ids: Ids) -> Result<usize, Vec<i32>> {
    let mut killed = std::collections::BTreeSet::new();
    for _ in 0..100 {
        let alive = processes_in(proc, ids);
        if alive.is_empty() {
            return Ok(killed.len());
        }
        for pid in alive {
            if let Some(p) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                killed.insert(pid);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let alive = processes_in(proc, ids);
    if alive.is_empty() {
        Ok(killed.len())
    } else {
        Err(alive)
    }
}

/// Who container `c` of `pod` runs as: `runAsUser`/`runAsGroup` (the container's over the
/// pod's), groups from `fsGroup` and `supplementalGroups`, the capabilities added. Without
/// `runAsUser` the process runs as root *of its namespace* — an unprivileged id on the host.
pub fn identity(pod: &Pod, c: &Container) -> Result<Identity, String> {
    let ps: PodSecurityContext = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.clone())
        .unwrap_or_default();
    let cs: SecurityContext = c.security_context.clone().unwrap_or_default();
    let id = |v: Option<i64>, what: &str| -> Result<Option<u32>, String> {
        v.map(|n| {
            u32::try_from(n)
                .ok()
                .filter(|n| *n < IDS_PER_POD)
                .ok_or_else(|| format!("{what} {n}: the process runtime maps ids 0 to 65535"))
        })
        .transpose()
    };
    let uid = id(cs.run_as_user.or(ps.run_as_user), "runAsUser")?.unwrap_or(0);
    let gid = id(cs.run_as_group.or(ps.run_as_group), "runAsGroup")?.unwrap_or(0);
    let non_root = cs.run_as_non_root.or(ps.run_as_non_root).unwrap_or(false);
    if non_root && uid == 0 {
        return Err(
            "container has runAsNonRoot and would run as root: set runAsUser (images are not \
             pulled, so there is no image user to check)"
                .into(),
        );
    }
    let mut groups: Vec<u32> = Vec::new();
    for g in ps
        .fs_group
        .into_iter()
        .chain(ps.supplemental_groups.into_iter().flatten())
    {
        if let Some(g) = id(Some(g), "group")? {
            groups.push(g);
        }
    }
    let seccomp = match cs
        .seccomp_profile
        .as_ref()
        .or(ps.seccomp_profile.as_ref())
        .map(|p| p.type_.as_str())
    {
        None | Some("RuntimeDefault") => Seccomp::RuntimeDefault,
        Some("Unconfined") => Seccomp::Unconfined,
        Some(other) => {
            return Err(format!(
                "seccompProfile type {other:?} is not supported by the process runtime: use RuntimeDefault (or Unconfined where Pod Security allows it)"
            ));
        }
    };
    let capabilities = cs.capabilities.and_then(|c| c.add).unwrap_or_default();
    crate::sandbox::capability_set(&capabilities)?;
    Ok(Identity {
        uid,
        gid,
        groups,
        capabilities,
        workdir: c.working_dir.clone(),
        seccomp,
    })
}

/// Who owns the files of a pod's volumes on the host: the pod's root, and its `fsGroup`
/// when it has one — then, as the kubelet does, files are group-readable by it (a Secret
/// with `defaultMode: 0400` becomes 0440 for a non-root container to read it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Host uid.
    pub uid: u32,
    /// Host gid.
    pub gid: u32,
    /// Whether `fsGroup` set the group (and files get its read bit).
    pub fs_group: bool,
}

impl Owner {
    /// The owner of `pod`'s volumes given its id range.
    pub fn of(pod: &Pod, ids: Ids) -> Owner {
        let fs_group = pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|sc| sc.fs_group)
            .and_then(|g| u32::try_from(g).ok())
            .filter(|g| *g < ids.count);
        Owner {
            uid: ids.base,
            gid: ids.base + fs_group.unwrap_or(0),
            fs_group: fs_group.is_some(),
        }
    }
}

/// A pod's volumes, prepared in `dir` (owned by `owner`): name → host path.
pub async fn prepare_volumes(
    client: &Arc<dyn Client>,
    pod: &Pod,
    dir: &Path,
    owner: Option<Owner>,
) -> Result<BTreeMap<String, PathBuf>, String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut out = BTreeMap::new();
    for v in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
    {
        let path = dir.join(&v.name);
        if let Some(claim) = &v.persistent_volume_claim {
            // A claim bound to a hostPath volume (Tessera's provisioner makes those): the
            // directory on this node, made on first use, owned by the pod.
            let host = claimed_host_path(client, ns, &claim.claim_name).await?;
            if !host.exists() {
                // Writable by whichever ids the claim's pods run as, now and later (each pod
                // of a set may get another id range), as a hostPath volume is.
                std::fs::create_dir_all(&host).map_err(|e| format!("{}: {e}", host.display()))?;
                std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o777))
                    .map_err(|e| format!("{}: {e}", host.display()))?;
            }
            out.insert(v.name.clone(), host);
            continue;
        }
        if let Some(host) = &v.host_path {
            let p = PathBuf::from(&host.path);
            match host.type_.as_deref().unwrap_or("") {
                "DirectoryOrCreate" => std::fs::create_dir_all(&p)
                    .map_err(|e| format!("hostPath {}: {e}", p.display()))?,
                "Directory" if !p.is_dir() => {
                    return Err(format!(
                        "hostPath type check failed: {} is not a directory",
                        p.display()
                    ));
                }
                "File" if !p.is_file() => {
                    return Err(format!(
                        "hostPath type check failed: {} is not a file",
                        p.display()
                    ));
                }
                _ => {}
            }
            out.insert(v.name.clone(), p);
            continue;
        }
        fresh_dir(&path, owner)?;
        if v.empty_dir.is_some() {
            // As the kubelet makes it: writable by whichever user the containers run as.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        } else if let Some(cm) = &v.config_map {
            let keys = read_keys(client, false, ns, &cm.name).await?;
            match keys {
                Some(keys) => {
                    write_keys(&path, &keys, cm.items.as_deref(), cm.default_mode, owner)?
                }
                None if cm.optional.unwrap_or(false) => {}
                None => return Err(format!("configmap \"{}\" not found", cm.name)),
            }
        } else if let Some(s) = &v.secret {
            let name = s.secret_name.clone().unwrap_or_default();
            match read_keys(client, true, ns, &name).await? {
                Some(keys) => write_keys(&path, &keys, s.items.as_deref(), s.default_mode, owner)?,
                None if s.optional.unwrap_or(false) => {}
                None => return Err(format!("secret \"{name}\" not found")),
            }
        } else {
            return Err(format!(
                "volume {:?}: the process runtime mounts emptyDir, configMap, secret, hostPath and persistentVolumeClaim (bound to a hostPath volume) volumes",
                v.name
            ));
        }
        out.insert(v.name.clone(), path);
    }
    Ok(out)
}

/// The host path of the volume claim `ns/name` is bound to.
async fn claimed_host_path(
    client: &Arc<dyn Client>,
    ns: &str,
    name: &str,
) -> Result<PathBuf, String> {
    let claims = find_resource("", "v1", "persistentvolumeclaims").map_err(|e| e.message)?;
    let volumes = find_resource("", "v1", "persistentvolumes").map_err(|e| e.message)?;
    let claim = client
        .get(claims, Some(ns), name)
        .await
        .map_err(|e| format!("persistentvolumeclaim {name:?}: {}", e.message))?;
    let Some(volume) = claim["spec"]["volumeName"]
        .as_str()
        .filter(|_| claim["status"]["phase"] == "Bound")
    else {
        return Err(format!("persistentvolumeclaim {name:?} is not bound yet"));
    };
    let pv = client
        .get(volumes, None, volume)
        .await
        .map_err(|e| format!("persistentvolume {volume:?}: {}", e.message))?;
    pv["spec"]["hostPath"]["path"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| {
            format!("persistentvolume {volume:?} is not a hostPath volume: the process runtime mounts only those")
        })
}

fn fresh_dir(path: &Path, owner: Option<Owner>) -> Result<(), String> {
    std::fs::create_dir_all(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(o) = owner {
        std::os::unix::fs::chown(path, Some(o.uid), Some(o.gid))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if o.fs_group {
            let mode = std::fs::metadata(path)
                .map_err(|e| e.to_string())?
                .permissions()
                .mode();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | 0o2050))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// The keys of ConfigMap (with its `binaryData`) or Secret (decoded) `name` in `ns`, as
/// bytes; `None` if it does not exist.
pub async fn read_keys(
    client: &Arc<dyn Client>,
    secret: bool,
    ns: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
    let plural = if secret { "secrets" } else { "configmaps" };
    let res = find_resource("", "v1", plural).map_err(|e| e.message)?;
    let obj = match client.get(res, Some(ns), name).await {
        Ok(o) => o,
        Err(e) if e.code == 404 => return Ok(None),
        Err(e) => return Err(format!("reading {plural} {name}: {}", e.message)),
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = BTreeMap::new();
    let decode = |k: &str, v: &Value| -> Result<Vec<u8>, String> {
        b64.decode(v.as_str().unwrap_or_default())
            .map_err(|e| format!("{plural} {name} key {k} is not base64: {e}"))
    };
    for (k, v) in obj["data"].as_object().into_iter().flatten() {
        let bytes = if secret {
            decode(k, v)?
        } else {
            v.as_str().unwrap_or_default().as_bytes().to_vec()
        };
        out.insert(k.clone(), bytes);
    }
    for (k, v) in obj["binaryData"].as_object().into_iter().flatten() {
        out.insert(k.clone(), decode(k, v)?);
    }
    Ok(Some(out))
}

/// Writes the keys (all, or the `items` chosen, at their paths) as files with their modes.
fn write_keys(
    dir: &Path,
    keys: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    owner: Option<Owner>,
) -> Result<(), String> {
    let mode = |m: Option<i32>| (m.or(default_mode).unwrap_or(0o644) & 0o777) as u32;
    let chosen: Vec<(String, &Vec<u8>, u32)> = match items {
        Some(items) => items
            .iter()
            .map(|i| {
                keys.get(&i.key)
                    .map(|v| (i.path.clone(), v, mode(i.mode)))
                    .ok_or_else(|| format!("couldn't find key {} for the volume", i.key))
            })
            .collect::<Result<_, _>>()?,
        None => keys
            .iter()
            .map(|(k, v)| (k.clone(), v, mode(None)))
            .collect(),
    };
    for (rel, bytes, m) in chosen {
        if rel.split('/').any(|p| p == ".." || p.is_empty()) {
            return Err(format!(
                "volume item path {rel:?} must be relative, without '..'"
            ));
        }
        let file = dir.join(&rel);
        if let Some(parent) = file.parent() {
            fresh_dir(parent, owner)?;
        }
        std::fs::write(&file, bytes).map_err(|e| format!("{}: {e}", file.display()))?;
        let m = if owner.is_some_and(|o| o.fs_group) {
            m | 0o440
        } else {
            m
        };
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(m))
            .map_err(|e| format!("{}: {e}", file.display()))?;
        if let Some(o) = owner {
            std::os::unix::fs::chown(&file, Some(o.uid), Some(o.gid))
                .map_err(|e| format!("{}: {e}", file.display()))?;
        }
    }
    Ok(())
}

/// `sub` inside volume directory `base`, its missing directories made as the kubelet makes
/// them — one level at a time, relative to a descriptor, never following a symbolic link: a
/// container that planted one in its volume does not get the host's root to create
/// directories elsewhere. (The sandbox checks again, from its own descriptor, that the
/// source it mounts is inside the volume.)
fn sub_path(base: &Path, sub: &str) -> Result<PathBuf, String> {
    use rustix::fs::{Mode, OFlags};
    if sub.starts_with('/') || sub.split('/').any(|p| p == "..") {
        return Err(format!("subPath {sub:?} must be relative, without '..'"));
    }
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open(base, flags | OFlags::DIRECTORY, Mode::empty())
        .map_err(|e| format!("volume {}: {e}", base.display()))?;
    let parts: Vec<&str> = sub
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let opened = match rustix::fs::openat(&dir, *part, flags, Mode::empty()) {
            Err(rustix::io::Errno::NOENT) => {
                rustix::fs::mkdirat(&dir, *part, Mode::from_raw_mode(0o777))
                    .map_err(|e| format!("subPath {sub:?}: creating {part}: {e}"))?;
                rustix::fs::openat(&dir, *part, flags, Mode::empty())
            }
            other => other,
        }
        .map_err(|e| format!("subPath {sub:?}: {part}: {e}"))?;
        let kind = rustix::fs::fstat(&opened)
            .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode))
            .map_err(|e| e.to_string())?;
        match kind {
            rustix::fs::FileType::Symlink => {
                return Err(format!(
                    "subPath {sub:?}: {part} is a symbolic link, which a subPath may not pass"
                ));
            }
            rustix::fs::FileType::Directory => {}
            _ if last => {}
            _ => return Err(format!("subPath {sub:?}: {part} is not a directory")),
        }
        dir = opened;
    }
    Ok(base.join(parts.join("/")))
}

/// Container `c`'s mounts from its `volumeMounts`.
pub fn binds(c: &Container, volumes: &BTreeMap<String, PathBuf>) -> Result<Vec<Bind>, String> {
    let mut out = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let base = volumes
            .get(&m.name)
            .ok_or_else(|| format!("volumeMount {:?}: the pod has no such volume", m.name))?;
        let (source, within) = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => (sub_path(base, sub)?, Some(base.clone())),
            None => (base.clone(), None),
        };
        if !m.mount_path.starts_with('/') {
            return Err(format!("mountPath {:?} must be absolute", m.mount_path));
        }
        out.push(Bind {
            source,
            target: m.mount_path.clone(),
            read_only: m.read_only.unwrap_or(false),
            within,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn identity_follows_the_security_context() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000},
            "containers": [{"name": "a"}, {"name": "b", "securityContext": {"runAsUser": 7,
                "capabilities": {"add": ["NET_BIND_SERVICE"]}}}]}}));
        let spec = p.spec.clone().expect("spec");
        let a = identity(&p, &spec.containers[0]).expect("a");
        assert_eq!((a.uid, a.gid, a.groups.clone()), (1000, 3000, vec![2000]));
        let b = identity(&p, &spec.containers[1]).expect("b");
        assert_eq!((b.uid, b.gid), (7, 3000));
        assert_eq!(b.capabilities, vec!["NET_BIND_SERVICE".to_owned()]);
        assert_eq!(
            a.seccomp,
            Seccomp::RuntimeDefault,
            "the default without a profile"
        );
        let unconfined = pod(json!({"metadata": {"name": "p"}, "spec": {
            "securityContext": {"seccompProfile": {"type": "Unconfined"}},
            "containers": [{"name": "a"}, {"name": "b", "securityContext":
                {"seccompProfile": {"type": "RuntimeDefault"}}}]}}));
        let s = unconfined.spec.clone().expect("s");
        assert_eq!(
            identity(&unconfined, &s.containers[0]).expect("a").seccomp,
            Seccomp::Unconfined
        );
        assert_eq!(
            identity(&unconfined, &s.containers[1]).expect("b").seccomp,
            Seccomp::RuntimeDefault
        );
        let local = pod(
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a",
            "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "x.json"}}}]}}),
        );
        let e =
            identity(&local, &local.spec.clone().expect("s").containers[0]).expect_err("localhost");
        assert!(e.contains("Localhost"), "{e}");
        let nonroot = pod(json!({"metadata": {"name": "p"}, "spec": {
            "securityContext": {"runAsNonRoot": true}, "containers": [{"name": "a"}]}}));
        let e =
            identity(&nonroot, &nonroot.spec.clone().expect("s").containers[0]).expect_err("root");
        assert!(e.contains("runAsNonRoot"), "{e}");
        let big = pod(json!({"metadata": {"name": "p"}, "spec": {
            "containers": [{"name": "a", "securityContext": {"runAsUser": 70000}}]}}));
        assert!(identity(&big, &big.spec.clone().expect("s").containers[0]).is_err());
    }

    #[test]
    fn id_ranges_are_exclusive_and_released() {
        let dir = tempfile::tempdir().expect("tmp");
        let a = IdLease::take(dir.path(), "n1", "uid-a").expect("a");
        let b = IdLease::take(dir.path(), "n1", "uid-a").expect("b");
        assert_ne!(a.ids.base, b.ids.base, "two claims never share a range");
        assert!(a.ids.base >= FIRST_ID && a.ids.base.is_multiple_of(IDS_PER_POD));
        let base = a.ids.base;
        drop(a);
        let c = IdLease::take(dir.path(), "n1", "uid-a").expect("c");
        assert_eq!(c.ids.base, base, "a released range is taken again");
        // A restarted node frees what it held; another node's claims stay.
        let other = IdLease::take(dir.path(), "n2", "uid-x").expect("other");
        IdLease::release_stale(dir.path(), "n1");
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
        drop((b, c, other));
    }

    #[test]
    fn leftovers_are_found_by_any_of_their_ids_and_zombies_left_out() {
        let proc = tempfile::tempdir().expect("tmp");
        let ids = Ids {
            base: FIRST_ID + 3 * IDS_PER_POD,
            count: IDS_PER_POD,
        };
        let status = |pid: &str, state: &str, uids: [u32; 4]| {
            let d = proc.path().join(pid);
            std::fs::create_dir(&d).expect("dir");
            let line = uids.map(|u| u.to_string()).join("\t");
            std::fs::write(
                d.join("status"),
                format!("Name:\tsleep\nState:\t{state}\nUid:\t{line}\nGid:\t0\t0\t0\t0\n"),
            )
            .expect("status");
        };
        status("10", "S (sleeping)", [ids.base; 4]);
        // Only its effective id is the pod's (a setuid helper would look like this).
        status("11", "R (running)", [0, ids.base + 1000, 0, 0]);
        status("12", "Z (zombie)", [ids.base; 4]);
        status("13", "S (sleeping)", [0; 4]);
        // The next pod's range, and the id just before this range.
        status("14", "S (sleeping)", [ids.base + IDS_PER_POD; 4]);
        status("15", "S (sleeping)", [ids.base - 1; 4]);
        std::fs::create_dir(proc.path().join("self")).expect("not a pid");
        let mut found = processes_in(proc.path(), ids);
        found.sort_unstable();
        assert_eq!(found, [10, 11]);
    }

    #[test]
    fn mounts_refuse_escaping_paths() {
        let c: Container = serde_json::from_value(json!({"name": "c", "volumeMounts": [
            {"name": "v", "mountPath": "/data", "subPath": "../../etc"}]}))
        .expect("c");
        let vols = BTreeMap::from([("v".to_owned(), PathBuf::from("/x"))]);
        assert!(binds(&c, &vols).expect_err("escape").contains("subPath"));
        // A link planted in the volume is not followed, and nothing is made through it.
        let vol = tempfile::tempdir().expect("tmp");
        let outside = tempfile::tempdir().expect("tmp");
        std::os::unix::fs::symlink(outside.path(), vol.path().join("esc")).expect("link");
        let e = sub_path(vol.path(), "esc/made").expect_err("through a link");
        assert!(e.contains("symbolic link"), "{e}");
        assert!(!outside.path().join("made").exists());
        let made = sub_path(vol.path(), "a/b").expect("made");
        assert!(made.is_dir());
        std::fs::write(vol.path().join("a/file"), "x").expect("file");
        assert!(
            sub_path(vol.path(), "a/file").is_ok(),
            "a file at the end is fine"
        );
        assert!(sub_path(vol.path(), "a/file/x").is_err());
        let ok: Container = serde_json::from_value(json!({"name": "c", "volumeMounts": [
            {"name": "v", "mountPath": "/data", "readOnly": true}]}))
        .expect("c");
        let b = binds(&ok, &vols).expect("binds");
        assert_eq!(b[0].target, "/data");
        assert!(b[0].read_only);
        let dir = tempfile::tempdir().expect("tmp");
        let keys = BTreeMap::from([("k".to_owned(), b"v".to_vec())]);
        let bad = [KeyToPath {
            key: "k".into(),
            path: "../k".into(),
            mode: None,
        }];
        assert!(write_keys(dir.path(), &keys, Some(&bad), None, None).is_err());
        write_keys(dir.path(), &keys, None, Some(0o400), None).expect("write");
        let m = std::fs::metadata(dir.path().join("k")).expect("k");
        assert_eq!(m.permissions().mode() & 0o777, 0o400);
    }
}
