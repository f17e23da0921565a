//! The sharded store's configuration in the flag syntax operators know from kube-apiserver.

use super::routing::resource_segment;
use crate::error::StoreError;

/// Where a sharded store's keys go: a default etcd cluster, per-resource overrides and
/// tenant shards. Each cluster is a list of member URLs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardingConfig {
    /// Members of the default cluster (`--etcd-servers a,b,c`).
    pub default: Vec<String>,
    /// `(key segment, members)` per override, in flag order.
    pub overrides: Vec<(String, Vec<String>)>,
    /// Members of each tenant shard, in flag order.
    pub tenant_shards: Vec<Vec<String>>,
}

fn urls(list: &str, what: &str) -> Result<Vec<String>, StoreError> {
    let v: Vec<String> = list
        .split([',', ';'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if v.is_empty() {
        return Err(bad(format!("{what}: no server URLs given")));
    }
    for u in &v {
        if !(u.starts_with("http://") || u.starts_with("https://")) {
            return Err(bad(format!(
                "{what}: {u:?} is not a URL (expected http://host:port)"
            )));
        }
    }
    Ok(v)
}

fn bad(reason: String) -> StoreError {
    StoreError::InvalidToken {
        what: "store configuration",
        reason,
    }
}

impl ShardingConfig {
    /// Parses the three flags:
    /// - `etcd_servers`: one cluster, members separated by `,`;
    /// - `overrides`: kube-apiserver's `--etcd-servers-overrides` syntax,
    ///   `group/resource#member;member`, overrides separated by `,` (`/events#http://b:2379`);
    /// - `tenant_shards`: shards separated by `;`, members of one shard by `,`.
    pub fn parse(
        etcd_servers: &str,
        overrides: Option<&str>,
        tenant_shards: Option<&str>,
    ) -> Result<ShardingConfig, StoreError> {
        let default = urls(etcd_servers, "--etcd-servers")?;
        let mut parsed_overrides = Vec::new();
        for item in overrides
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let (gr, servers) = item.split_once('#').ok_or_else(|| {
                bad(format!(
                    "--etcd-servers-overrides: {item:?} must look like group/resource#http://host:port"
                ))
            })?;
            let (group, resource) = gr.split_once('/').ok_or_else(|| {
                bad(format!(
                    "--etcd-servers-overrides: {gr:?} must be group/resource (\"/events\" for the core group)"
                ))
            })?;
            if resource.is_empty() {
                return Err(bad(format!(
                    "--etcd-servers-overrides: {gr:?} names no resource"
                )));
            }
            let segment = resource_segment(group, resource);
            if parsed_overrides.iter().any(|(s, _)| *s == segment) {
                return Err(bad(format!(
                    "--etcd-servers-overrides: {gr:?} is given twice"
                )));
            }
            parsed_overrides.push((segment, urls(servers, "--etcd-servers-overrides")?));
        }
        let mut shards = Vec::new();
        for shard in tenant_shards
            .unwrap_or("")
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            shards.push(urls(shard, "--tenant-shards")?);
        }
        Ok(ShardingConfig {
            default,
            overrides: parsed_overrides,
            tenant_shards: shards,
        })
    }

    /// True when there is more than the default cluster.
    pub fn is_sharded(&self) -> bool {
        !self.overrides.is_empty() || !self.tenant_shards.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_operator_syntax() {
        let c = ShardingConfig::parse(
            "http://a:2379",
            Some("/events#http://b:2379;http://b2:2379,apps/deployments#http://e:2379"),
            Some("http://c:2379;http://d:2379,http://d2:2379"),
        )
        .expect("valid");
        assert_eq!(c.default, vec!["http://a:2379"]);
        assert_eq!(c.overrides[0].0, "events");
        assert_eq!(c.overrides[0].1.len(), 2);
        assert_eq!(c.overrides[1].0, "deployments");
        assert_eq!(c.tenant_shards.len(), 2);
        assert_eq!(c.tenant_shards[1].len(), 2);
    }

    #[test]
    fn rejects_what_it_cannot_use() {
        for (servers, overrides, shards) in [
            ("", None, None),
            ("a:2379", None, None),
            ("http://a:2379", Some("events#http://b:2379"), None),
            ("http://a:2379", Some("/events"), None),
            ("http://a:2379", Some("/events#"), None),
            (
                "http://a:2379",
                Some("/events#http://b,/events#http://c"),
                None,
            ),
            ("http://a:2379", None, Some("c:2379")),
        ] {
            assert!(
                ShardingConfig::parse(servers, overrides, shards).is_err(),
                "{servers} {overrides:?} {shards:?}"
            );
        }
    }
}
