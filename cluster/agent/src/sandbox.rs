//! The process runtime's sandbox: what makes a process node an isolation boundary. A
//! container's command runs
//!
//! - in its own **user namespace**, whose ids map to a range of host ids that belongs to its
//!   pod alone ([`Ids`]): container root is an unprivileged host uid;
//! - in its own **mount** namespace, whose root is a fresh tmpfs holding read-only binds of
//!   the host's `/usr`, `/etc` and library directories, a private `/tmp`, a minimal `/dev`, its
//!   own `/proc`, and the pod's volumes — nothing of the agent's data directory, tokens, keys or
//!   logs;
//! - in its own **PID**, **IPC** and **UTS** namespaces, and its own **network** namespace
//!   (loopback only) unless the pod was allowed `hostNetwork`;
//! - as `runAsUser`/`runAsGroup` (in the namespace), with `no_new_privs`, an empty capability
//!   bounding set but for `securityContext.capabilities.add`, no capabilities at all unless
//!   it runs as root in its namespace, and the default seccomp filter ([`crate::seccomp`])
//!   unless the pod asked for `Unconfined`;
//! - inside the cgroups the agent made for it (limits enforced by the kernel).
//!
//! The work is done by the agent's own binary, re-run as a helper (`<exe> [prefix] exec …`):
//! namespaces are per process, so they are entered by a fresh single-threaded process, never
//! by the agent's multi-threaded runtime. Three processes result: the supervisor (in the
//! host's namespaces, the agent's child: it forwards signals and reports the exit code), the
//! container's init (PID 1 of the new PID namespace: it builds the root, drops privileges,
//! reaps orphans and forwards signals), and the command itself. `join` runs an exec probe in
//! a running container's namespaces with the same identity.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::process::{Pid, Signal, WaitOptions};
use rustix::thread::{CapabilitySet, CapabilitySets, LinkNameSpaceType, UnshareFlags};
use serde::{Deserialize, Serialize};

/// How the container's ids map to the host's: ids `0..count` of the container are host ids
/// `base..base + count`, a range no other pod on the host has.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Ids {
    /// First host id.
    pub base: u32,
    /// How many.
    pub count: u32,
}

/// A bind mount into the container.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Bind {
    /// The host path.
    pub source: PathBuf,
    /// Where it appears in the container (absolute).
    pub target: String,
    /// Mounted read-only.
    pub read_only: bool,
    /// The directory `source` must resolve inside (a `subPath` of a volume the container
    /// itself can write: a symbolic link planted there must not reach the host).
    pub within: Option<PathBuf>,
}

/// Who the container's processes are.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Identity {
    /// Its uid in the namespace.
    pub uid: u32,
    /// Its gid in the namespace.
    pub gid: u32,
    /// Supplementary groups (`fsGroup`, `supplementalGroups`).
    pub groups: Vec<u32>,
    /// Capabilities kept (`securityContext.capabilities.add`, as admitted), by Linux name
    /// without `CAP_`.
    pub capabilities: Vec<String>,
    /// Working directory.
    pub workdir: Option<String>,
    /// Its seccomp filter.
    #[serde(default)]
    pub seccomp: Seccomp,
}

/// A container's seccomp filter (`securityContext.seccompProfile.type`).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum Seccomp {
    /// The sandbox's default filter ([`crate::seccomp`]); also what a pod gets that names
    /// none (the kubelet's `SeccompDefault`).
    #[default]
    RuntimeDefault,
    /// No filter (Pod Security allows it only at `privileged`).
    Unconfined,
}

/// Everything the helper needs to start a container.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Spec {
    /// The arguments that re-run the helper after the executable (`["sandbox"]` for the
    /// `tessera` binary, empty for `tessera-sandbox`).
    pub prefix: Vec<String>,
    /// Id mapping.
    pub ids: Ids,
    /// Who runs.
    pub identity: Identity,
    /// The host name (the pod's).
    pub hostname: String,
    /// Volumes.
    pub binds: Vec<Bind>,
    /// Shares the host's network namespace (`hostNetwork`).
    pub host_network: bool,
    /// Shares the host's IPC namespace (`hostIPC`).
    pub host_ipc: bool,
    /// cgroup directories to join (one for v2; one per controller for v1).
    pub cgroups: Vec<PathBuf>,
}

/// What `join` needs: the container's init (its host pid) and who to be.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct JoinSpec {
    /// The host pid of the container's init.
    pub pid: u32,
    /// Who runs.
    pub identity: Identity,
    /// cgroup directories to join.
    pub cgroups: Vec<PathBuf>,
    /// Standard input is a terminal: the command gets a session of its own with it as the
    /// controlling terminal (`kubectl exec -t`).
    #[serde(default)]
    pub tty: bool,
}

/// How the agent starts the helper.
#[derive(Clone, Debug)]
pub struct Launcher {
    /// The executable.
    pub exe: PathBuf,
    /// Arguments before the helper's own (`["sandbox"]` for `tessera`).
    pub prefix: Vec<String>,
}

impl Launcher {
    /// `exe prefix… exec <spec> -- argv…`: the command that runs `argv` in the sandbox.
    pub fn exec(&self, spec: &Spec, argv: &[String]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.exe);
        c.args(&self.prefix)
            .arg("exec")
            .arg(serde_json::to_string(spec).unwrap_or_default())
            .arg("--")
            .args(argv);
        c
    }

    /// `exe prefix… join <spec> -- argv…`: runs `argv` inside a running container.
    pub fn join(&self, spec: &JoinSpec, argv: &[String]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.exe);
        c.args(&self.prefix)
            .arg("join")
            .arg(serde_json::to_string(spec).unwrap_or_default())
            .arg("--")
            .args(argv);
        c
    }
}

/// The helper's entry point: `args` are what follows the prefix (`exec <spec> -- argv…`,
/// `init …`, `map …`, `join …`). Never returns.
pub fn main(args: Vec<OsString>) -> ! {
    let args: Vec<String> = args
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let code = match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tessera sandbox: {e}");
            // What a container runtime answers when it cannot start a container.
            128
        }
    };
    std::process::exit(code)
}

fn run(args: &[String]) -> Result<i32, String> {
    let (verb, rest) = args
        .split_first()
        .ok_or("usage: sandbox exec|join <spec> -- command…")?;
    let split = |rest: &[String]| -> Result<(String, Vec<String>), String> {
        let spec = rest.first().ok_or("a spec is required")?.clone();
        let argv: Vec<String> = rest
            .iter()
            .skip(1)
            .skip_while(|a| *a != "--")
            .skip(1)
            .cloned()
            .collect();
        if argv.is_empty() {
            return Err("no command after --".into());
        }
        Ok((spec, argv))
    };
    match verb.as_str() {
        "exec" => {
            let (raw, argv) = split(rest)?;
            let spec: Spec = serde_json::from_str(&raw).map_err(|e| format!("spec: {e}"))?;
            supervise(&spec, &argv)
        }
        "init" => {
            let (raw, argv) = split(rest)?;
            let spec: Spec = serde_json::from_str(&raw).map_err(|e| format!("spec: {e}"))?;
            init(&spec, &argv)
        }
        "map" => map_ids(rest).map(|()| 0),
        "join" => {
            let (raw, argv) = split(rest)?;
            let spec: JoinSpec = serde_json::from_str(&raw).map_err(|e| format!("spec: {e}"))?;
            join(&spec, &argv)
        }
        other => Err(format!("unknown sandbox verb {other:?}")),
    }
}

fn join_cgroups(cgroups: &[PathBuf]) -> Result<(), String> {
    let me = std::process::id().to_string();
    for cg in cgroups {
        std::fs::write(cg.join("cgroup.procs"), &me)
            .map_err(|e| format!("joining cgroup {}: {e}", cg.display()))?;
    }
    Ok(())
}

fn map_line(inner: u32, outer: u32, count: u32) -> String {
    format!("{inner} {outer} {count}\n")
}

/// `map <pid> <base> <count>`: run by the supervisor's child in the host's user namespace,
/// which alone may map a range of host ids; waits for a byte on stdin (the namespace exists).
fn map_ids(rest: &[String]) -> Result<(), String> {
    let [pid, base, count] = rest else {
        return Err("usage: map <pid> <base> <count>".into());
    };
    let mut byte = [0u8; 1];
    std::io::Read::read_exact(&mut std::io::stdin(), &mut byte)
        .map_err(|e| format!("waiting for the namespace: {e}"))?;
    let base: u32 = base.parse().map_err(|_| "bad base")?;
    let count: u32 = count.parse().map_err(|_| "bad count")?;
    for file in ["uid_map", "gid_map"] {
        std::fs::write(format!("/proc/{pid}/{file}"), map_line(0, base, count))
            .map_err(|e| format!("writing {file} of {pid}: {e}"))?;
    }
    Ok(())
}

/// The supervisor: joins the cgroups, makes the namespaces, starts the init in them, and
/// forwards signals to it until it ends; exits as it did.
fn supervise(spec: &Spec, argv: &[String]) -> Result<i32, String> {
    join_cgroups(&spec.cgroups)?;
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    // The init is started from this descriptor, not the path: the root is staged on a tmpfs
    // over `STAGING`, which hides the executable when it lives there (a checkout in /tmp).
    let exe_fd = rustix::fs::open(
        &exe,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| format!("opening own executable {}: {e}", exe.display()))?;
    let mut flags =
        UnshareFlags::NEWUSER | UnshareFlags::NEWNS | UnshareFlags::NEWPID | UnshareFlags::NEWUTS;
    if !spec.host_network {
        flags |= UnshareFlags::NEWNET;
    }
    if !spec.host_ipc {
        flags |= UnshareFlags::NEWIPC;
    }
    let mut mapper = Command::new(&exe)
        .args(&spec.prefix)
        .args([
            "map",
            &std::process::id().to_string(),
            &spec.ids.base.to_string(),
            &spec.ids.count.to_string(),
        ])
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the id mapper: {e}"))?;
    // SAFETY: the helper is single-threaded (no runtime has started) and FILES/FS are not
    // unshared, so no thread can observe a descriptor table or cwd that changed under it.
    #[allow(unsafe_code)]
    let unshared = unsafe { rustix::thread::unshare_unsafe(flags) };
    unshared.map_err(|e| format!("creating namespaces: {e} (user namespaces must be enabled)"))?;
    if let Some(mut stdin) = mapper.stdin.take() {
        std::io::Write::write_all(&mut stdin, b"1")
            .map_err(|e| format!("signalling the id mapper: {e}"))?;
    }
    let st = mapper.wait().map_err(|e| format!("id mapper: {e}"))?;
    if !st.success() {
        return Err("mapping the container's ids failed".into());
    }
    // The volumes are opened while this process is still the host's root by id (they are in
    // the agent's private directory); the root is built as the namespace's root, whose files
    // carry an id the namespace maps — and what it starts keeps the namespace's capabilities.
    let sources = open_sources(spec)?;
    let zero_g = rustix::process::Gid::from_raw(0);
    rustix::thread::set_thread_res_gid(zero_g, zero_g, zero_g)
        .map_err(|e| format!("setgid 0: {e}"))?;
    let zero_u = rustix::process::Uid::from_raw(0);
    rustix::thread::set_thread_res_uid(zero_u, zero_u, zero_u)
        .map_err(|e| format!("setuid 0: {e}"))?;
    build_root(spec, &sources)?;
    // The init needs neither the volumes' host paths nor the cgroups (its command line is
    // visible in the container).
    let for_init = Spec {
        binds: Vec::new(),
        cgroups: Vec::new(),
        ..spec.clone()
    };
    let child = Command::new(fd_path(&exe_fd))
        .args(&spec.prefix)
        .arg("init")
        .arg(serde_json::to_string(&for_init).map_err(|e| e.to_string())?)
        .arg("--")
        .args(argv)
        .spawn()
        .map_err(|e| format!("starting the container's init: {e}"))?;
    forward_until_exit(child.id())
}

/// Forwards termination signals to `pid` and reaps children until `pid` ends; its exit code
/// (128 + signal if it was killed).
fn forward_until_exit(pid: u32) -> Result<i32, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    rt.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let kinds = [
            (SignalKind::terminate(), Signal::TERM),
            (SignalKind::interrupt(), Signal::INT),
            (SignalKind::hangup(), Signal::HUP),
            (SignalKind::quit(), Signal::QUIT),
            (SignalKind::user_defined1(), Signal::USR1),
            (SignalKind::user_defined2(), Signal::USR2),
        ];
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for (kind, sig) in kinds {
            let mut s = signal(kind).map_err(|e| format!("signal handler: {e}"))?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while s.recv().await.is_some() {
                    let _ = tx.send(sig);
                }
            });
        }
        let mut chld = signal(SignalKind::child()).map_err(|e| format!("signal handler: {e}"))?;
        let target = Pid::from_raw(pid as i32).ok_or("no pid")?;
        loop {
            // Reap whatever ended (orphans re-parented to an init, too).
            while let Ok(Some((p, status))) = rustix::process::wait(WaitOptions::NOHANG) {
                if p == target {
                    return Ok(status
                        .exit_status()
                        .or_else(|| status.terminating_signal().map(|s| 128 + s))
                        .unwrap_or(1));
                }
            }
            tokio::select! {
                Some(sig) = rx.recv() => { let _ = rustix::process::kill_process(target, sig); }
                _ = chld.recv() => {}
                // A child may end between the reap and the wait for SIGCHLD.
                () = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
            }
        }
    })
}

/// The directories of the host bound read-only into every container (symbolic links are
/// recreated as links: `/bin` is `usr/bin` on a merged-/usr system).
const HOST_DIRS: &[&str] = &[
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// The devices a container sees (bound from the host's).
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

fn mkdir_all(p: &Path) -> Result<(), String> {
    std::fs::create_dir_all(p).map_err(|e| format!("creating {}: {e}", p.display()))
}

/// The mount flags a read-only remount must keep (the kernel refuses to drop the ones it
/// locked when the mount entered the user namespace).
fn locked_flags(p: &Path) -> MountFlags {
    let mut out = MountFlags::empty();
    if let Ok(st) = rustix::fs::statvfs(p) {
        use rustix::fs::StatVfsMountFlags as S;
        for (s, m) in [
            (S::NOSUID, MountFlags::NOSUID),
            (S::NODEV, MountFlags::NODEV),
            (S::NOEXEC, MountFlags::NOEXEC),
            (S::NOATIME, MountFlags::NOATIME),
            (S::NODIRATIME, MountFlags::NODIRATIME),
            (S::RELATIME, MountFlags::RELATIME),
        ] {
            if st.f_flag.contains(s) {
                out |= m;
            }
        }
    }
    out
}

fn bind(source: &Path, target: &Path, read_only: bool) -> Result<(), String> {
    rustix::mount::mount_bind_recursive(source, target)
        .map_err(|e| format!("mounting {} at {}: {e}", source.display(), target.display()))?;
    if read_only {
        let flags = MountFlags::BIND | MountFlags::RDONLY | locked_flags(target);
        rustix::mount::mount_remount(target, flags, "")
            .map_err(|e| format!("making {} read-only: {e}", target.display()))?;
    }
    Ok(())
}

fn tmpfs(target: &Path, mode: &str, flags: MountFlags) -> Result<(), String> {
    mkdir_all(target)?;
    rustix::mount::mount(
        "tmpfs",
        target,
        "tmpfs",
        flags,
        std::ffi::CString::new(format!("mode={mode},uid=0,gid=0"))
            .map_err(|e| e.to_string())?
            .as_c_str(),
    )
    .map_err(|e| format!("mounting a tmpfs at {}: {e}", target.display()))
}

/// Where the container's root is assembled, in the private mount namespace (a directory
/// every id may traverse; the host's own is untouched, the mount being private).
pub const STAGING: &str = "/tmp";

/// Each volume's source, opened as a path-only descriptor: resolved once, by the host's
/// root, and checked to be inside its volume when it came through a `subPath`. Mounting
/// from the descriptor leaves no window for a swapped symbolic link.
fn open_sources(spec: &Spec) -> Result<Vec<rustix::fd::OwnedFd>, String> {
    use rustix::fs::{Mode, OFlags};
    spec.binds
        .iter()
        .map(|b| {
            let fd = rustix::fs::open(&b.source, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
                .map_err(|e| format!("volume source {}: {e}", b.source.display()))?;
            if let Some(within) = &b.within {
                let real = std::fs::read_link(fd_path(&fd)).map_err(|e| e.to_string())?;
                let base = std::fs::canonicalize(within).map_err(|e| e.to_string())?;
                if !real.starts_with(&base) {
                    return Err(format!(
                        "subPath {} leads outside its volume",
                        b.source.display()
                    ));
                }
            }
            Ok(fd)
        })
        .collect()
}

fn fd_path(fd: &rustix::fd::OwnedFd) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The container's root: a tmpfs with the host's system directories (read-only), `/tmp`,
/// `/dev`, `/proc` and the volumes (`sources`, one per bind).
fn build_root(spec: &Spec, sources: &[rustix::fd::OwnedFd]) -> Result<(), String> {
    let root = Path::new(STAGING);
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(|e| format!("making mounts private: {e}"))?;
    tmpfs(root, "0755", MountFlags::NOSUID | MountFlags::NODEV)?;
    for dir in HOST_DIRS {
        let host = Path::new(dir);
        let inside = root.join(dir.trim_start_matches('/'));
        match std::fs::symlink_metadata(host) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(host).map_err(|e| format!("{dir}: {e}"))?;
                std::os::unix::fs::symlink(&to, &inside)
                    .map_err(|e| format!("linking {dir}: {e}"))?;
            }
            Ok(m) if m.is_dir() => {
                mkdir_all(&inside)?;
                bind(host, &inside, true)?;
            }
            _ => {}
        }
    }
    let nosuid_nodev = MountFlags::NOSUID | MountFlags::NODEV;
    tmpfs(&root.join("tmp"), "1777", nosuid_nodev)?;
    mkdir_all(&root.join("var/tmp"))?;
    tmpfs(&root.join("run"), "0755", nosuid_nodev)?;
    let dev = root.join("dev");
    tmpfs(&dev, "0755", MountFlags::NOSUID | MountFlags::NOEXEC)?;
    for d in DEVICES {
        let target = dev.join(d);
        std::fs::write(&target, b"").map_err(|e| format!("creating /dev/{d}: {e}"))?;
        bind(&Path::new("/dev").join(d), &target, false)?;
    }
    for (name, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(name)).map_err(|e| format!("/dev/{name}: {e}"))?;
    }
    tmpfs(&dev.join("shm"), "1777", nosuid_nodev | MountFlags::NOEXEC)?;
    mkdir_all(&root.join("proc"))?;
    for (b, fd) in spec.binds.iter().zip(sources) {
        let target = root.join(b.target.trim_start_matches('/'));
        let is_file = rustix::fs::fstat(fd).is_ok_and(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Directory
        });
        if is_file {
            if let Some(parent) = target.parent() {
                mkdir_all(parent)?;
            }
            if !target.exists() {
                std::fs::write(&target, b"")
                    .map_err(|e| format!("creating the mount point {}: {e}", b.target))?;
            }
        } else {
            mkdir_all(&target).map_err(|e| {
                format!("{e} (a volume's mountPath cannot be inside a read-only host directory)")
            })?;
        }
        bind(&fd_path(fd), &target, b.read_only)?;
    }
    if let Some(w) = &spec.identity.workdir {
        let _ = std::fs::create_dir_all(root.join(w.trim_start_matches('/')));
    }
    Ok(())
}

/// Replaces the root with the built one; the host's is detached and gone.
fn enter_root(root: &Path) -> Result<(), String> {
    let old = root.join(".old-root");
    mkdir_all(&old)?;
    rustix::process::pivot_root(root, &old).map_err(|e| format!("pivot_root: {e}"))?;
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;
    rustix::mount::unmount("/.old-root", UnmountFlags::DETACH)
        .map_err(|e| format!("detaching the host's root: {e}"))?;
    std::fs::remove_dir("/.old-root").map_err(|e| format!("removing /.old-root: {e}"))?;
    Ok(())
}

/// The capabilities named (Kubernetes spells them without `CAP_`, either case).
pub fn capability_set(names: &[String]) -> Result<CapabilitySet, String> {
    let mut set = CapabilitySet::empty();
    for n in names {
        let upper = n.to_ascii_uppercase();
        let name = upper.strip_prefix("CAP_").unwrap_or(&upper);
        let cap =
            CapabilitySet::from_name(name).ok_or_else(|| format!("unknown capability {n:?}"))?;
        set |= cap;
    }
    Ok(set)
}

/// Becomes `id`: groups, gid, uid; keeps only the allowed capabilities (and none unless
/// root in the namespace); sets `no_new_privs`, so no setuid binary or file capability can
/// give any back.
fn drop_privileges(id: &Identity) -> Result<(), String> {
    let keep = capability_set(&id.capabilities)?;
    for bit in 0..64 {
        let cap = CapabilitySet::from_bits_retain(1u64 << bit);
        if keep.contains(cap) {
            continue;
        }
        match rustix::thread::remove_capability_from_bounding_set(cap) {
            Ok(()) => {}
            // Past the last capability this kernel knows.
            Err(rustix::io::Errno::INVAL) => break,
            Err(e) => return Err(format!("dropping capability {bit}: {e}")),
        }
    }
    let groups: Vec<rustix::process::Gid> = id
        .groups
        .iter()
        .map(|g| rustix::process::Gid::from_raw(*g))
        .collect();
    rustix::thread::set_thread_groups(&groups).map_err(|e| format!("setgroups: {e}"))?;
    let gid = rustix::process::Gid::from_raw(id.gid);
    rustix::thread::set_thread_res_gid(gid, gid, gid).map_err(|e| format!("setgid: {e}"))?;
    let uid = rustix::process::Uid::from_raw(id.uid);
    rustix::thread::set_thread_res_uid(uid, uid, uid).map_err(|e| format!("setuid: {e}"))?;
    let kept = if id.uid == 0 {
        keep
    } else {
        CapabilitySet::empty()
    };
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: kept,
            permitted: kept,
            inheritable: CapabilitySet::empty(),
        },
    )
    .map_err(|e| format!("capset: {e}"))?;
    let _ = rustix::thread::clear_ambient_capability_set();
    rustix::thread::set_no_new_privs(true).map_err(|e| format!("no_new_privs: {e}"))?;
    if id.seccomp == Seccomp::RuntimeDefault {
        crate::seccomp::install_default()?;
    }
    Ok(())
}

fn workdir(id: &Identity) -> Result<(), String> {
    let dir = id.workdir.as_deref().unwrap_or("/");
    std::env::set_current_dir(dir).map_err(|e| format!("workingDir {dir}: {e}"))
}

/// Starts `argv` (with the environment the helper was given) and waits for it as init.
fn start_and_wait(argv: &[String]) -> Result<i32, String> {
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", argv[0]))?;
    forward_until_exit(child.id())
}

/// The container's init: PID 1 of its namespace.
fn init(spec: &Spec, argv: &[String]) -> Result<i32, String> {
    let _ = rustix::process::set_parent_process_death_signal(Some(Signal::KILL));
    // Only a process inside the new PID namespace can mount its /proc.
    rustix::mount::mount(
        "proc",
        Path::new(STAGING).join("proc"),
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        None,
    )
    .map_err(|e| format!("mounting /proc: {e}"))?;
    if !spec.host_network {
        // A new network namespace has its loopback down.
        let up = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .status()
            .map_err(|e| format!("bringing loopback up (is iproute2 installed?): {e}"))?;
        if !up.success() {
            return Err("bringing loopback up failed".into());
        }
    }
    enter_root(Path::new(STAGING))?;
    rustix::system::sethostname(spec.hostname.as_bytes())
        .map_err(|e| format!("sethostname: {e}"))?;
    drop_privileges(&spec.identity)?;
    workdir(&spec.identity)?;
    start_and_wait(argv)
}

/// Runs `argv` inside a running container (an exec probe): joins its cgroups, then its
/// namespaces (user first: it grants the rights to join the rest), becomes its identity,
/// and waits for the command.
fn join(spec: &JoinSpec, argv: &[String]) -> Result<i32, String> {
    join_cgroups(&spec.cgroups)?;
    let open = |ns: &str| {
        std::fs::File::open(format!("/proc/{}/ns/{ns}", spec.pid))
            .map_err(|e| format!("the container's {ns} namespace: {e}"))
    };
    let order = [
        ("user", LinkNameSpaceType::User),
        ("ipc", LinkNameSpaceType::InterProcessCommunication),
        ("uts", LinkNameSpaceType::HostNameAndNISDomainName),
        ("net", LinkNameSpaceType::Network),
        ("pid", LinkNameSpaceType::ProcessID),
        ("mnt", LinkNameSpaceType::Mount),
    ];
    let host_root = std::fs::metadata("/")
        .map(|m| (m.dev(), m.ino()))
        .map_err(|e| e.to_string())?;
    // Opened before any is entered: after the mount namespace, /proc is the container's.
    let files: Vec<_> = order
        .iter()
        .map(|(name, t)| open(name).map(|f| (*name, *t, f)))
        .collect::<Result<_, _>>()?;
    for (name, t, f) in &files {
        let same = std::fs::metadata(format!("/proc/self/ns/{name}"))
            .ok()
            .zip(f.metadata().ok())
            .is_some_and(|(a, b)| a.ino() == b.ino());
        if same {
            continue;
        }
        rustix::thread::move_into_link_name_space(std::os::fd::AsFd::as_fd(f), Some(*t))
            .map_err(|e| format!("entering the container's {name} namespace: {e}"))?;
    }
    // Until the init has switched to the container's root, its mount namespace still shows
    // the host's: a probe that came too early must not run there.
    let root = std::fs::metadata("/").map_err(|e| e.to_string())?;
    if (root.dev(), root.ino()) == host_root {
        return Err("the container is still starting".into());
    }
    if spec.tty {
        // A session of its own whose controlling terminal is the one it was given: the
        // command (its child) inherits both, so job control and ^C work.
        rustix::process::setsid().map_err(|e| format!("setsid: {e}"))?;
        rustix::process::ioctl_tiocsctty(std::io::stdin())
            .map_err(|e| format!("taking the terminal: {e}"))?;
    }
    drop_privileges(&spec.identity)?;
    workdir(&spec.identity)?;
    // The PID namespace applies to children: the command runs as one. Its standard streams
    // are this helper's (an exec probe's are empty; `kubectl exec`'s are the client's).
    let child = match Command::new(&argv[0]).args(&argv[1..]).spawn() {
        Ok(c) => c,
        // As a shell answers: 127 for a command that is not there, 126 for one that may not
        // run.
        Err(e) => {
            eprintln!("exec: {:?}: {e}", argv[0]);
            return Ok(match e.kind() {
                std::io::ErrorKind::NotFound => 127,
                _ => 126,
            });
        }
    };
    forward_until_exit(child.id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_names_as_kubernetes_spells_them() {
        let set = capability_set(&["NET_BIND_SERVICE".into(), "cap_chown".into()]).expect("known");
        assert_eq!(set, CapabilitySet::NET_BIND_SERVICE | CapabilitySet::CHOWN);
        assert!(capability_set(&["FLY".into()]).is_err());
    }

    #[test]
    fn specs_round_trip() {
        let spec = Spec {
            prefix: vec!["sandbox".into()],
            ids: Ids {
                base: 1 << 30,
                count: 65536,
            },
            identity: Identity {
                uid: 1000,
                gid: 1000,
                groups: vec![2000],
                capabilities: vec![],
                workdir: Some("/work".into()),
                seccomp: Seccomp::Unconfined,
            },
            hostname: "web-0".into(),
            binds: vec![Bind {
                source: "/data/v".into(),
                target: "/cache".into(),
                read_only: false,
                within: None,
            }],
            host_network: false,
            host_ipc: false,
            cgroups: vec![],
        };
        let raw = serde_json::to_string(&spec).expect("json");
        assert_eq!(serde_json::from_str::<Spec>(&raw).expect("back"), spec);
    }
}
