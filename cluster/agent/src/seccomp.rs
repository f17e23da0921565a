//! The sandbox's default seccomp filter (`seccompProfile: RuntimeDefault`, and what a pod
//! gets when it names none).
//!
//! The user namespace and the empty capability set already refuse what needs privilege on
//! the host. What they leave reachable is kernel code an unprivileged process may call and
//! that has a record of exploitable bugs: nested user namespaces (which hand back the rights
//! to mount and to set up network devices inside them), keyrings, eBPF, perf events,
//! userfaultfd, io_uring, the new mount API, file handles. The filter refuses those with
//! `EPERM`, as the default profiles of Docker and containerd do; everything else is allowed,
//! so ordinary programs are not affected. `clone3` answers `ENOSYS` (its flags are behind a
//! pointer the filter cannot read), and C libraries then fall back to `clone`, whose flags
//! it can.
//!
//! It is built with `seccompiler` (rust-vmm's filter compiler, used by Firecracker) and
//! installed last, after `no_new_privs`, just before the container's command starts; exec
//! probes get the same.

use std::collections::BTreeMap;

use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

/// Refused with `EPERM` whatever their arguments.
const REFUSED: &[(&str, i64)] = &[
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("keyctl", libc::SYS_keyctl),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("setns", libc::SYS_setns),
    ("acct", libc::SYS_acct),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("reboot", libc::SYS_reboot),
    ("quotactl", libc::SYS_quotactl),
    ("syslog", libc::SYS_syslog),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
];

/// Refused with `EPERM` when their first argument (the flags) asks for a new user
/// namespace.
const NO_NEW_USER_NAMESPACE: &[(&str, i64)] =
    &[("unshare", libc::SYS_unshare), ("clone", libc::SYS_clone)];

/// The syscall names the filter refuses outright (for docs and tests).
pub fn refused() -> impl Iterator<Item = &'static str> {
    REFUSED.iter().map(|(n, _)| *n)
}

fn arch() -> Result<TargetArch, String> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e| format!("seccomp on {}: {e:?}", std::env::consts::ARCH))
}

/// The two programs: `EPERM` for the refused calls, `ENOSYS` for `clone3`.
fn programs() -> Result<[seccompiler::BpfProgram; 2], String> {
    let arch = arch()?;
    fn e(what: &'static str) -> impl Fn(seccompiler::BackendError) -> String {
        move |err| format!("seccomp {what}: {err}")
    }
    let new_user = SeccompRule::new(vec![
        SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(libc::CLONE_NEWUSER as u64),
            libc::CLONE_NEWUSER as u64,
        )
        .map_err(e("condition"))?,
    ])
    .map_err(e("rule"))?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        REFUSED.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    for (_, nr) in NO_NEW_USER_NAMESPACE {
        rules.insert(*nr, vec![new_user.clone()]);
    }
    let eperm = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(e("filter"))?;
    let enosys = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(e("filter"))?;
    Ok([
        eperm.try_into().map_err(e("compiling"))?,
        enosys.try_into().map_err(e("compiling"))?,
    ])
}

/// Installs the default filter on this thread (the helper is single-threaded; children
/// inherit it). `no_new_privs` must be set first.
pub fn install_default() -> Result<(), String> {
    for p in programs()? {
        seccompiler::apply_filter(&p).map_err(|e| format!("installing the seccomp filter: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_filter_compiles_for_this_machine() {
        let [eperm, enosys] = programs().expect("programs");
        // Every refused call and the two flag checks are in the program.
        assert!(eperm.len() > REFUSED.len() + NO_NEW_USER_NAMESPACE.len());
        assert!(!enosys.is_empty());
        assert!(refused().any(|n| n == "keyctl"));
    }
}
