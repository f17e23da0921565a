//! Prometheus for a fleet that `tessera up` runs on this machine: it writes
//! `DATA/prometheus.yml`, a scrape configuration naming every metrics endpoint it serves,
//! and beside it `DATA/prometheus-rules.yml`, the recording rules and alerts of
//! `charts/tessera/monitoring/rules.yml` (built into the binary), so that
//!
//! ```sh
//! prometheus --config.file=DATA/prometheus.yml --web.listen-address=127.0.0.1:9090
//! ```
//!
//! watches the fleet with the same rules a production install uses. Each shard's targets
//! carry the label `shard`, which the rules and the dashboard aggregate by, and every
//! scrape bears the fleet's metrics token (`pki/metrics.token`), without which the metrics
//! ports leave out the samples that name a tenant.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The recording rules and alerts (`charts/tessera/monitoring/rules.yml`).
pub const RULES: &str = include_str!("../charts/tessera/monitoring/rules.yml");

/// How often the written configuration scrapes and evaluates rules: often enough for a
/// fleet on one machine to show what it does as it does it.
pub const INTERVAL: &str = "5s";

/// One metrics endpoint to scrape.
pub struct Target {
    /// The Prometheus job: `tessera-federation` or `tessera-shard`.
    pub job: &'static str,
    /// Where `/metrics` is served.
    pub addr: SocketAddr,
    /// The shard it belongs to (its `shard` label), if any.
    pub shard: Option<String>,
}

/// The scrape configuration for `targets`, with the rules file `rules` beside it; every
/// scrape bears the token in `token_file`.
pub fn config(targets: &[Target], rules: &str, token_file: &Path) -> String {
    // Strings are written as JSON strings, which YAML reads as they are.
    let quote = |s: &str| serde_json::to_string(s).expect("a string serializes");
    let mut out = format!(
        "# Written by `tessera up`: Prometheus' configuration for the fleet it runs.\n\
         #   prometheus --config.file=prometheus.yml --web.listen-address=127.0.0.1:9090\n\
         global:\n  scrape_interval: {INTERVAL}\n  evaluation_interval: {INTERVAL}\n\
         rule_files:\n  - {}\n\
         scrape_configs:\n",
        quote(rules)
    );
    let mut jobs: Vec<&'static str> = Vec::new();
    for t in targets {
        if !jobs.contains(&t.job) {
            jobs.push(t.job);
        }
    }
    for job in jobs {
        out.push_str(&format!(
            "  - job_name: {}\n    authorization:\n      credentials_file: {}\n    static_configs:\n",
            quote(job),
            quote(&token_file.display().to_string())
        ));
        for t in targets.iter().filter(|t| t.job == job) {
            out.push_str(&format!(
                "      - targets: [{}]\n",
                quote(&t.addr.to_string())
            ));
            if let Some(shard) = &t.shard {
                out.push_str(&format!("        labels: {{shard: {}}}\n", quote(shard)));
            }
        }
    }
    out
}

/// Writes `DATA/prometheus.yml` and `DATA/prometheus-rules.yml`; returns the first. The
/// token file is named relative to DATA when it is inside it.
pub fn write(data_dir: &Path, targets: &[Target], token_file: &Path) -> anyhow::Result<PathBuf> {
    let rules = "prometheus-rules.yml";
    // Owner-only, as everything in the data directory.
    tessera_apiserver::pki::write_private(&data_dir.join(rules), RULES)?;
    let path = data_dir.join("prometheus.yml");
    let token_file = token_file.strip_prefix(data_dir).unwrap_or(token_file);
    tessera_apiserver::pki::write_private(&path, &config(targets, rules, token_file))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_names_each_target_once_with_its_shard() {
        let t = |job, port, shard: Option<&str>| Target {
            job,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            shard: shard.map(str::to_owned),
        };
        let c = config(
            &[
                t("tessera-federation", 9464, None),
                t("tessera-shard", 9466, Some("shard-0")),
                t("tessera-shard", 9467, Some("shard-1")),
            ],
            "prometheus-rules.yml",
            Path::new("pki/metrics.token"),
        );
        assert_eq!(c.matches("job_name:").count(), 2, "{c}");
        assert_eq!(
            c.matches("    authorization:\n      credentials_file: \"pki/metrics.token\"\n")
                .count(),
            2,
            "{c}"
        );
        assert!(
            c.contains("rule_files:\n  - \"prometheus-rules.yml\"\n"),
            "{c}"
        );
        assert!(
            c.contains(
                "      - targets: [\"127.0.0.1:9467\"]\n        labels: {shard: \"shard-1\"}\n"
            ),
            "{c}"
        );
        assert!(
            c.contains("- targets: [\"127.0.0.1:9464\"]\n  - job_name: \"tessera-shard\"\n"),
            "{c}"
        );
    }
}
