//! `tessera store backup|restore` as an operator uses them: a backup of a running shard,
//! taken through its API by the admin (and refused to anyone else), restored into the
//! shard's data directory after a loss: the shard comes back as it was at the backup.

mod support;

use std::process::Command;

use support::{Cluster, tenant_token};

fn tessera(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .output()
        .expect("run tessera");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// GETs the backup path with `token`: the HTTP code and the body's start.
fn backup_as(c: &Cluster, token: &str) -> String {
    let out = Command::new("curl")
        .args(["-sS", "-w", "\n%{http_code}", "--cacert"])
        .arg(c.dir.path().join("pki/ca.crt"))
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .arg(format!("{}/tessera/v1/store/backup", c.server()))
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_backup_taken_online_restores_the_shard_as_it_was() {
    let mut c = Cluster::start();
    let kubeconfig = c.kubeconfig.display().to_string();
    c.ok(&["create", "namespace", "keep"]);
    for i in 0..20 {
        c.ok(&[
            "create",
            "configmap",
            &format!("cm-{i}"),
            "-n",
            "keep",
            "--from-literal=k=v",
        ]);
    }
    c.deploy("keep", "web", 3);

    let scratch = tempfile::tempdir().expect("tempdir");
    let file = scratch.path().join("shard.backup");
    let file_s = file.display().to_string();
    let (ok, out) = tessera(&[
        "store",
        "backup",
        "--kubeconfig",
        &kubeconfig,
        "--out",
        &file_s,
    ]);
    assert!(ok, "{out}");
    assert!(
        out.starts_with("Backed up https://127.0.0.1:") && out.contains(" keys, "),
        "{out}"
    );
    // Never over an existing file.
    let (ok, out) = tessera(&[
        "store",
        "backup",
        "--kubeconfig",
        &kubeconfig,
        "--out",
        &file_s,
    ]);
    assert!(!ok && out.contains("exists already"), "{out}");
    // A backup holds every tenant's objects: the admin's alone.
    let a = backup_as(&c, "not-a-token");
    assert!(a.ends_with("\n401"), "{a}");
    let t = c.file(
        "tenant.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: team}\nspec: {namespaces: [team-a]}\n",
    );
    c.ok(&["apply", "-f", &t]);
    let a = backup_as(&c, &tenant_token(&c, "team"));
    assert!(
        a.ends_with("\n403") && a.contains("for the admin token"),
        "{a}"
    );
    // The running store's directory is locked: an offline backup of it is refused.
    let (ok, out) = tessera(&[
        "store",
        "backup",
        "--data-dir",
        &c.dir.path().display().to_string(),
        "--out",
        &scratch.path().join("offline").display().to_string(),
    ]);
    assert!(!ok && out.contains("locked by another process"), "{out}");

    // Written after the backup: lost with the restore.
    c.ok(&[
        "create",
        "configmap",
        "late",
        "-n",
        "keep",
        "--from-literal=k=v",
    ]);
    c.kill();

    // The shard's store is lost; its pki/ is not. Restore the backup in its place.
    let store = c.dir.path().join("store");
    std::fs::rename(&store, scratch.path().join("lost-store")).expect("move the store away");
    let data_dir = c.dir.path().display().to_string();
    let (ok, out) = tessera(&[
        "store",
        "restore",
        "--from",
        &file_s,
        "--data-dir",
        &data_dir,
    ]);
    assert!(ok && out.starts_with("Restored revision "), "{out}");
    // Never over a store.
    let (ok, out) = tessera(&[
        "store",
        "restore",
        "--from",
        &file_s,
        "--data-dir",
        &data_dir,
    ]);
    assert!(!ok && out.contains("holds a store already"), "{out}");
    // A damaged backup is refused.
    let mut bytes = std::fs::read(&file).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    let bad = scratch.path().join("bad.backup");
    std::fs::write(&bad, &bytes).expect("write");
    let other = scratch.path().join("other").display().to_string();
    let (ok, out) = tessera(&[
        "store",
        "restore",
        "--from",
        &bad.display().to_string(),
        "--data-dir",
        &other,
    ]);
    assert!(!ok && out.contains("checksum mismatch"), "{out}");

    c.restart();
    let names = c.ok(&["get", "configmaps", "-n", "keep", "-o", "name"]);
    for i in 0..20 {
        assert!(names.contains(&format!("configmap/cm-{i}\n")), "{names}");
    }
    assert!(!names.contains("configmap/late"), "{names}");
    c.rollout("keep", "web");
    // The restored shard takes writes, and keeps them across a restart.
    c.ok(&[
        "create",
        "configmap",
        "after",
        "-n",
        "keep",
        "--from-literal=k=v",
    ]);
    c.kill();
    // Stopped, its data directory can be backed up offline too.
    let offline = scratch.path().join("offline.backup").display().to_string();
    let (ok, out) = tessera(&[
        "store",
        "backup",
        "--data-dir",
        &data_dir,
        "--out",
        &offline,
    ]);
    assert!(ok && out.contains(" keys, "), "{out}");
    c.restart();
    c.ok(&["get", "configmap", "after", "-n", "keep"]);
}
