//! The data directory holds every stored object (Secrets included), the admin token, the CA's
//! key and every tenant's container logs: only its owner may read any of it.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Creates `dir` (0700) if missing, and takes group and other permissions off everything in
/// it (directories 0700 at most, files 0600 plus the owner's execute bit), saying what it
/// fixed: data directories made by earlier versions were world-readable. Symbolic links are
/// neither followed nor changed.
pub fn secure(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| anyhow::anyhow!("creating the data directory {}: {e}", dir.display()))?;
    let mut fixed = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode() & 0o7777;
        let want = if meta.is_dir() {
            0o700
        } else {
            0o600 | (mode & 0o100)
        };
        if mode != want && mode & 0o077 != 0 {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(want)).map_err(
                |e| anyhow::anyhow!("making {} private to its owner: {e}", path.display()),
            )?;
            fixed.push(path.clone());
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?
            {
                todo.push(entry?.path());
            }
        }
    }
    if let Some(first) = fixed.first() {
        tracing::warn!(
            count = fixed.len(),
            first = %first.display(),
            "the data directory was readable by others; made it private to its owner"
        );
    }
    Ok(fixed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p)
            .expect("meta")
            .permissions()
            .mode()
            & 0o777
    }

    #[test]
    fn loose_modes_are_taken_back_and_private_ones_left_alone() {
        let root = tempfile::tempdir().expect("tmp");
        let data = root.path().join("data");
        let pki = data.join("pki");
        std::fs::create_dir_all(&pki).expect("dirs");
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::set_permissions(&pki, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let token = pki.join("admin.token");
        std::fs::write(&token, "x").expect("write");
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let script = data.join("run.sh");
        std::fs::write(&script, "x").expect("write");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let private = data.join("private");
        std::fs::write(&private, "x").expect("write");
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o400)).expect("chmod");
        std::os::unix::fs::symlink("/etc/hostname", data.join("link")).expect("symlink");

        let fixed = secure(&data).expect("secure");
        assert_eq!(fixed.len(), 4, "{fixed:?}");
        assert_eq!(mode(&data), 0o700);
        assert_eq!(mode(&pki), 0o700);
        assert_eq!(mode(&token), 0o600);
        assert_eq!(mode(&script), 0o700, "the owner keeps execute");
        assert_eq!(mode(&private), 0o400, "not loosened");
        assert!(
            secure(&data).expect("again").is_empty(),
            "nothing left to fix"
        );

        let fresh = root.path().join("new/data");
        secure(&fresh).expect("created");
        assert_eq!(mode(&fresh), 0o700);
    }
}
