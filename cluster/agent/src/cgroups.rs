//! Resource limits for process containers, through the kernel's cgroups: `cpu.max`,
//! `memory.max` and `pids.max` under cgroup v2, or the same three controllers' files under
//! cgroup v1 (`cpu.cfs_quota_us`, `memory.limit_in_bytes`, `pids.max`) where the machine still
//! mounts v1. Each container gets `<root>/<node>/pod-<uid>/<container>`; the sandbox helper
//! moves itself in before it starts anything, so every process of the container is counted.
//! Where neither is available (or writable), [`Cgroups::detect`] says why and containers run
//! without limits — the node reports that in an event.

use std::path::{Path, PathBuf};

/// The CFS period, in microseconds (Kubernetes' default).
const PERIOD_US: u64 = 100_000;

/// What a container may use; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Thousandths of a CPU.
    pub cpu_milli: Option<u64>,
    /// Bytes of memory.
    pub memory: Option<u64>,
    /// Processes and threads.
    pub pids: Option<u64>,
}

/// The machine's cgroups, as this agent uses them.
#[derive(Clone, Debug)]
pub enum Cgroups {
    /// The unified hierarchy: one directory per container.
    V2(PathBuf),
    /// Legacy hierarchies: the `cpu`, `memory` and `pids` controllers' roots.
    V1 {
        /// `cpu` controller directory for Tessera.
        cpu: PathBuf,
        /// `memory`.
        memory: PathBuf,
        /// `pids`.
        pids: PathBuf,
    },
    /// No limits can be set, and why.
    Unavailable(String),
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("writing {value:?} to {}: {e}", path.display()))
}

impl Cgroups {
    /// Finds the cgroup hierarchy under `mount` (normally `/sys/fs/cgroup`) and makes
    /// Tessera's directory in it.
    pub fn detect(mount: &Path) -> Cgroups {
        match Self::try_detect(mount) {
            Ok(c) => c,
            Err(why) => Cgroups::Unavailable(why),
        }
    }

    fn try_detect(mount: &Path) -> Result<Cgroups, String> {
        let controllers = mount.join("cgroup.controllers");
        if controllers.exists() {
            let have = std::fs::read_to_string(&controllers).map_err(|e| e.to_string())?;
            for c in ["cpu", "memory", "pids"] {
                if !have.split_whitespace().any(|h| h == c) {
                    return Err(format!("cgroup v2 lacks the {c} controller"));
                }
            }
            let root = mount.join("tessera");
            std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
            // Controllers must be enabled at every level down to the containers'.
            write(&mount.join("cgroup.subtree_control"), "+cpu +memory +pids")?;
            write(&root.join("cgroup.subtree_control"), "+cpu +memory +pids")?;
            return Ok(Cgroups::V2(root));
        }
        let dir = |c: &str| mount.join(c).join("tessera");
        for c in ["cpu", "memory", "pids"] {
            let base = mount.join(c);
            if !base.join("cgroup.procs").exists() {
                return Err(format!(
                    "no cgroup v2 and no v1 {c} controller under {}",
                    mount.display()
                ));
            }
            std::fs::create_dir_all(dir(c)).map_err(|e| format!("{}: {e}", dir(c).display()))?;
        }
        Ok(Cgroups::V1 {
            cpu: dir("cpu"),
            memory: dir("memory"),
            pids: dir("pids"),
        })
    }

    /// Why limits are not enforced, if they are not.
    pub fn unavailable(&self) -> Option<&str> {
        match self {
            Cgroups::Unavailable(why) => Some(why),
            _ => None,
        }
    }

    fn pod_dirs(&self, node: &str, pod_uid: &str) -> Vec<PathBuf> {
        let rel = Path::new(node).join(format!("pod-{pod_uid}"));
        match self {
            Cgroups::V2(root) => vec![root.join(rel)],
            Cgroups::V1 { cpu, memory, pids } => {
                vec![cpu.join(&rel), memory.join(&rel), pids.join(&rel)]
            }
            Cgroups::Unavailable(_) => vec![],
        }
    }

    /// Makes a container's cgroup(s) with `limits`; the directories to join (none where
    /// cgroups are unavailable).
    pub fn create(
        &self,
        node: &str,
        pod_uid: &str,
        container: &str,
        limits: Limits,
    ) -> Result<Vec<PathBuf>, String> {
        let dirs: Vec<PathBuf> = self
            .pod_dirs(node, pod_uid)
            .into_iter()
            .map(|d| d.join(container))
            .collect();
        for d in &dirs {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        match self {
            Cgroups::V2(_) => {
                let d = &dirs[0];
                // Controllers pass down level by level: the node's, then the pod's.
                let pod = d.parent();
                for level in [pod.and_then(Path::parent), pod].into_iter().flatten() {
                    write(&level.join("cgroup.subtree_control"), "+cpu +memory +pids")?;
                }
                let cpu = limits
                    .cpu_milli
                    .map_or("max".to_owned(), |m| format!("{} {PERIOD_US}", quota_us(m)));
                write(&d.join("cpu.max"), &cpu)?;
                write(
                    &d.join("memory.max"),
                    &limits.memory.map_or("max".into(), |m| m.to_string()),
                )?;
                // No swap beyond the limit, as the kubelet configures it.
                let _ = write(&d.join("memory.swap.max"), "0");
                write(
                    &d.join("pids.max"),
                    &limits.pids.map_or("max".into(), |p| p.to_string()),
                )?;
            }
            Cgroups::V1 { .. } => {
                let (cpu, memory, pids) = (&dirs[0], &dirs[1], &dirs[2]);
                write(&cpu.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
                write(
                    &cpu.join("cpu.cfs_quota_us"),
                    &limits
                        .cpu_milli
                        .map_or("-1".into(), |m| quota_us(m).to_string()),
                )?;
                write(
                    &memory.join("memory.limit_in_bytes"),
                    &limits.memory.map_or("-1".into(), |m| m.to_string()),
                )?;
                write(
                    &pids.join("pids.max"),
                    &limits.pids.map_or("max".into(), |p| p.to_string()),
                )?;
            }
            Cgroups::Unavailable(_) => {}
        }
        Ok(dirs)
    }

    /// How many times the kernel's OOM killer has killed in a container's cgroups.
    pub fn oom_kills(&self, dirs: &[PathBuf]) -> u64 {
        let file = match self {
            Cgroups::V2(_) => "memory.events",
            Cgroups::V1 { .. } => "memory.oom_control",
            Cgroups::Unavailable(_) => return 0,
        };
        dirs.iter()
            .filter_map(|d| std::fs::read_to_string(d.join(file)).ok())
            .flat_map(|text| {
                text.lines()
                    .filter_map(|l| l.strip_prefix("oom_kill "))
                    .filter_map(|n| n.trim().parse::<u64>().ok())
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    /// Removes a pod's cgroups (its processes are gone).
    pub fn remove_pod(&self, node: &str, pod_uid: &str) {
        for d in self.pod_dirs(node, pod_uid) {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    // cgroup directories go with rmdir (their files are the kernel's).
                    if let Err(err) = std::fs::remove_dir(e.path()) {
                        tracing::debug!(error = %err, dir = %e.path().display(), "removing a cgroup");
                    }
                }
            }
            let _ = std::fs::remove_dir(&d);
        }
    }
}

/// CFS quota for `milli` thousandths of a CPU per period (never below the kernel's 1 ms).
fn quota_us(milli: u64) -> u64 {
    (milli * PERIOD_US / 1000).max(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_follow_the_kubelet() {
        assert_eq!(quota_us(500), 50_000);
        assert_eq!(quota_us(2000), 200_000);
        // 1m would be 100 µs: the kernel's floor is 1 ms.
        assert_eq!(quota_us(1), 1000);
    }

    #[test]
    fn no_hierarchy_says_why() {
        let dir = tempfile::tempdir().expect("tmp");
        let c = Cgroups::detect(dir.path());
        assert!(
            c.unavailable().is_some_and(|w| w.contains("no cgroup v2")),
            "{c:?}"
        );
        assert!(
            c.create("n", "u", "c", Limits::default())
                .expect("nothing to make")
                .is_empty()
        );
    }

    #[test]
    fn a_v1_layout_gets_the_three_limits() {
        // A directory shaped like a v1 mount (as cgroupfs shows it) — the files are plain
        // here, so this checks what is written where, not the kernel.
        let dir = tempfile::tempdir().expect("tmp");
        for c in ["cpu", "memory", "pids"] {
            std::fs::create_dir_all(dir.path().join(c)).expect("dir");
            std::fs::write(dir.path().join(c).join("cgroup.procs"), "").expect("procs");
        }
        let c = Cgroups::detect(dir.path());
        let dirs = c
            .create(
                "proc-0",
                "u1",
                "main",
                Limits {
                    cpu_milli: Some(250),
                    memory: Some(64 << 20),
                    pids: Some(32),
                },
            )
            .expect("create");
        assert_eq!(dirs.len(), 3);
        let read = |p: PathBuf| std::fs::read_to_string(p).expect("read");
        assert_eq!(read(dirs[0].join("cpu.cfs_quota_us")), "25000");
        assert_eq!(read(dirs[1].join("memory.limit_in_bytes")), "67108864");
        assert_eq!(read(dirs[2].join("pids.max")), "32");
        std::fs::write(
            dirs[1].join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .expect("oom");
        assert_eq!(c.oom_kills(&dirs), 2);
    }
}
