//! Encryption at rest, as kube-apiserver's `--encryption-provider-config` does it: a `Store`
//! wrapper that encrypts the values of chosen resources (Secrets, typically) before they reach
//! the backend — the embedded store's WAL and snapshots, or etcd — and decrypts them on every
//! read and watch event. A copied data directory or etcd backup then holds ciphertext.
//!
//! The configuration is Kubernetes' `EncryptionConfiguration` (`apiserver.config.k8s.io/v1`):
//! per list of resources, providers in order; the first encrypts new writes, all are tried to
//! read. Providers: `aesgcm` (AES-GCM with a random 96-bit nonce per write, 16- or 32-byte
//! keys, the object's key as additional data so a ciphertext cannot be moved to another key)
//! and `identity` (plaintext; list it last to read what was stored before encryption was
//! turned on). Stored form, as Kubernetes writes it: `k8s:enc:aesgcm:v1:<key name>:` then the
//! nonce, the ciphertext and the tag. Rotating a key is Kubernetes' procedure: add the new key
//! second, restart, move it first, restart, rewrite the objects, remove the old key.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use ring::aead::{AES_128_GCM, AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::Value;

use crate::Store;
use crate::error::{Result, StoreError};
use crate::types::{
    KeyValue, LeaseId, ListRequest, ListResponse, Op, OpResult, Revision, TxnResponse, WatchStream,
};

const AESGCM_PREFIX: &[u8] = b"k8s:enc:aesgcm:v1:";

struct AesKey {
    name: String,
    key: LessSafeKey,
}

enum Provider {
    AesGcm(Vec<AesKey>),
    Identity,
}

struct Rule {
    /// Key prefixes (`/registry/secrets/`); empty means every key (`*.*`).
    prefixes: Vec<Vec<u8>>,
    providers: Vec<Provider>,
}

/// A parsed `EncryptionConfiguration`.
pub struct EncryptionConfig {
    rules: Vec<Rule>,
    /// The resources named, for the start-up log.
    pub resources: Vec<String>,
}

impl std::fmt::Debug for EncryptionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EncryptionConfig({:?}, <keys redacted>)", self.resources)
    }
}

fn err(msg: impl Into<String>) -> String {
    format!("encryption config: {}", msg.into())
}

impl EncryptionConfig {
    /// Reads an `EncryptionConfiguration` object (already decoded from YAML or JSON).
    pub fn from_json(v: &Value) -> std::result::Result<EncryptionConfig, String> {
        if v["kind"] != "EncryptionConfiguration" {
            return Err(err(format!(
                "kind must be EncryptionConfiguration, not {}",
                v["kind"]
            )));
        }
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut rules = Vec::new();
        let mut resources = Vec::new();
        for (i, r) in v["resources"]
            .as_array()
            .ok_or_else(|| err("resources: a list is required"))?
            .iter()
            .enumerate()
        {
            let names: Vec<&str> = r["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if names.is_empty() {
                return Err(err(format!(
                    "resources[{i}].resources: at least one resource"
                )));
            }
            let mut prefixes = Vec::new();
            for n in &names {
                resources.push((*n).to_owned());
                if *n == "*.*" {
                    prefixes.clear();
                    break;
                }
                if n.contains('*') {
                    return Err(err(format!(
                        "resources[{i}]: {n:?}: only \"*.*\" and exact names (secrets, deployments.apps) are supported"
                    )));
                }
                let (resource, group) = n.split_once('.').unwrap_or((n, ""));
                let segment = tessera_core::keys::resource_segment(group, resource);
                prefixes.push(format!("{}{segment}/", tessera_core::keys::ROOT).into_bytes());
            }
            let mut providers = Vec::new();
            for (j, p) in r["providers"]
                .as_array()
                .ok_or_else(|| err(format!("resources[{i}].providers: a list is required")))?
                .iter()
                .enumerate()
            {
                let at = format!("resources[{i}].providers[{j}]");
                if p.get("identity").is_some() {
                    providers.push(Provider::Identity);
                } else if let Some(a) = p.get("aesgcm") {
                    let mut keys = Vec::new();
                    for k in a["keys"].as_array().into_iter().flatten() {
                        let name = k["name"]
                            .as_str()
                            .filter(|n| !n.is_empty() && !n.contains(':'))
                            .ok_or_else(|| {
                                err(format!("{at}: every key needs a name without ':'"))
                            })?;
                        let secret =
                            base64::Engine::decode(&b64, k["secret"].as_str().unwrap_or(""))
                                .map_err(|e| {
                                    err(format!("{at}: key {name}: secret is not base64: {e}"))
                                })?;
                        let alg = match secret.len() {
                            16 => &AES_128_GCM,
                            32 => &AES_256_GCM,
                            n => {
                                return Err(err(format!(
                                    "{at}: key {name}: {n} bytes; AES-GCM keys are 16 or 32 bytes"
                                )));
                            }
                        };
                        let key = UnboundKey::new(alg, &secret)
                            .map_err(|_| err(format!("{at}: key {name}: not a valid key")))?;
                        keys.push(AesKey {
                            name: name.to_owned(),
                            key: LessSafeKey::new(key),
                        });
                    }
                    if keys.is_empty() {
                        return Err(err(format!("{at}: aesgcm needs at least one key")));
                    }
                    providers.push(Provider::AesGcm(keys));
                } else {
                    let kind = p
                        .as_object()
                        .and_then(|o| o.keys().next().cloned())
                        .unwrap_or_default();
                    return Err(err(format!(
                        "{at}: provider {kind:?} is not supported (aesgcm and identity are)"
                    )));
                }
            }
            if providers.is_empty() {
                return Err(err(format!(
                    "resources[{i}].providers: at least one provider"
                )));
            }
            rules.push(Rule {
                prefixes,
                providers,
            });
        }
        Ok(EncryptionConfig { rules, resources })
    }

    fn rule(&self, key: &[u8]) -> Option<&Rule> {
        self.rules
            .iter()
            .find(|r| r.prefixes.is_empty() || r.prefixes.iter().any(|p| key.starts_with(p)))
    }

    /// `value` as stored for `key`.
    fn seal(&self, rng: &SystemRandom, key: &[u8], value: Bytes) -> Result<Bytes> {
        let Some(rule) = self.rule(key) else {
            return Ok(value);
        };
        match &rule.providers[0] {
            Provider::Identity => Ok(value),
            Provider::AesGcm(keys) => {
                let k = &keys[0];
                let mut nonce = [0u8; NONCE_LEN];
                rng.fill(&mut nonce)
                    .map_err(|_| StoreError::Internal("no randomness for a nonce".into()))?;
                let mut sealed = value.to_vec();
                k.key
                    .seal_in_place_append_tag(
                        Nonce::assume_unique_for_key(nonce),
                        Aad::from(key),
                        &mut sealed,
                    )
                    .map_err(|_| StoreError::Internal("AES-GCM sealing failed".into()))?;
                let mut out = Vec::with_capacity(
                    AESGCM_PREFIX.len() + k.name.len() + 1 + NONCE_LEN + sealed.len(),
                );
                out.extend_from_slice(AESGCM_PREFIX);
                out.extend_from_slice(k.name.as_bytes());
                out.push(b':');
                out.extend_from_slice(&nonce);
                out.extend_from_slice(&sealed);
                Ok(Bytes::from(out))
            }
        }
    }

    /// The plaintext of `value` stored at `key`.
    fn open(&self, key: &[u8], value: Bytes) -> Result<Bytes> {
        let Some(rule) = self.rule(key) else {
            return Ok(value);
        };
        let where_ = || String::from_utf8_lossy(key).into_owned();
        if let Some(rest) = value.strip_prefix(AESGCM_PREFIX) {
            let colon = rest.iter().position(|b| *b == b':').ok_or_else(|| {
                StoreError::Internal(format!(
                    "{}: an encrypted value without a key name",
                    where_()
                ))
            })?;
            let name = String::from_utf8_lossy(&rest[..colon]);
            let body = &rest[colon + 1..];
            let k = rule
                .providers
                .iter()
                .filter_map(|p| match p {
                    Provider::AesGcm(keys) => Some(keys),
                    Provider::Identity => None,
                })
                .flatten()
                .find(|k| k.name == name)
                .ok_or_else(|| {
                    StoreError::Internal(format!(
                        "{}: encrypted with key {name:?}, which the encryption config does not have",
                        where_()
                    ))
                })?;
            if body.len() < NONCE_LEN {
                return Err(StoreError::Internal(format!(
                    "{}: a truncated encrypted value",
                    where_()
                )));
            }
            let (nonce, sealed) = body.split_at(NONCE_LEN);
            let mut buf = sealed.to_vec();
            let nonce = Nonce::try_assume_unique_for_key(nonce)
                .map_err(|_| StoreError::Internal("bad nonce".into()))?;
            let plain = k.key.open_in_place(nonce, Aad::from(key), &mut buf).map_err(|_| {
                StoreError::Internal(format!(
                    "{}: the value does not decrypt with key {name:?} (tampered, or moved from another key)",
                    where_()
                ))
            })?;
            let n = plain.len();
            buf.truncate(n);
            return Ok(Bytes::from(buf));
        }
        if rule
            .providers
            .iter()
            .any(|p| matches!(p, Provider::Identity))
        {
            Ok(value)
        } else {
            Err(StoreError::Internal(format!(
                "{}: stored unencrypted, and the encryption config has no identity provider to read it (add `- identity: {{}}` last)",
                where_()
            )))
        }
    }

    fn open_kv(&self, mut kv: KeyValue) -> Result<KeyValue> {
        if !kv.value.is_empty() {
            kv.value = self.open(&kv.key, kv.value)?;
        }
        Ok(kv)
    }
}

/// A store whose values are encrypted per an [`EncryptionConfig`].
pub struct Encrypted {
    inner: Arc<dyn Store>,
    config: Arc<EncryptionConfig>,
    rng: SystemRandom,
}

impl Encrypted {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Store>, config: EncryptionConfig) -> Encrypted {
        Encrypted {
            inner,
            config: Arc::new(config),
            rng: SystemRandom::new(),
        }
    }
}

#[async_trait]
impl Store for Encrypted {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn txn_group(&self, key: &[u8]) -> usize {
        self.inner.txn_group(key)
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        self.inner
            .get(key)
            .await?
            .map(|kv| self.config.open_kv(kv))
            .transpose()
    }

    async fn list(&self, req: ListRequest) -> Result<ListResponse> {
        let mut resp = self.inner.list(req).await?;
        resp.kvs = resp
            .kvs
            .into_iter()
            .map(|kv| self.config.open_kv(kv))
            .collect::<Result<_>>()?;
        Ok(resp)
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<TxnResponse> {
        let ops = ops
            .into_iter()
            .map(|op| {
                Ok(match op {
                    Op::Create { key, value, lease } => {
                        let value = self.config.seal(&self.rng, &key, value)?;
                        Op::Create { key, value, lease }
                    }
                    Op::Update {
                        key,
                        value,
                        expected,
                        lease,
                    } => {
                        let value = self.config.seal(&self.rng, &key, value)?;
                        Op::Update {
                            key,
                            value,
                            expected,
                            lease,
                        }
                    }
                    Op::Put { key, value, lease } => {
                        let value = self.config.seal(&self.rng, &key, value)?;
                        Op::Put { key, value, lease }
                    }
                    other => other,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut resp = match self.inner.txn(ops).await {
            Ok(r) => r,
            // A failed precondition reports the key's current value: decrypted too.
            Err(StoreError::PreconditionFailed(mut p)) => {
                if let Some(kv) = p.current.take() {
                    p.current = Some(self.config.open_kv(kv)?);
                }
                return Err(StoreError::PreconditionFailed(p));
            }
            Err(e) => return Err(e),
        };
        resp.results = resp
            .results
            .into_iter()
            .map(|r| {
                Ok(match r {
                    OpResult::Written(kv) => OpResult::Written(self.config.open_kv(kv)?),
                    OpResult::Deleted(kv) => OpResult::Deleted(self.config.open_kv(kv)?),
                    OpResult::Checked => OpResult::Checked,
                })
            })
            .collect::<Result<_>>()?;
        Ok(resp)
    }

    async fn watch(&self, prefix: &[u8], after: Option<Revision>) -> Result<WatchStream> {
        let config = self.config.clone();
        let stream = self.inner.watch(prefix, after).await?;
        Ok(Box::pin(stream.map(move |batch| {
            let mut batch = batch?;
            for e in &mut batch.events {
                if !e.kv.value.is_empty() {
                    e.kv.value = config.open(&e.kv.key, e.kv.value.clone())?;
                }
                if let Some(prev) = e.prev_kv.take() {
                    e.prev_kv = Some(config.open_kv(prev)?);
                }
            }
            Ok(batch)
        })))
    }

    async fn lease_grant(&self, ttl: i64) -> Result<LeaseId> {
        self.inner.lease_grant(ttl).await
    }

    async fn lease_keep_alive(&self, id: LeaseId) -> Result<i64> {
        self.inner.lease_keep_alive(id).await
    }

    async fn lease_revoke(&self, id: LeaseId) -> Result<()> {
        self.inner.lease_revoke(id).await
    }

    async fn compact(&self, revision: &Revision) -> Result<()> {
        self.inner.compact(revision).await
    }

    /// The backup holds the stored values as they are stored: encrypted ones stay encrypted,
    /// and need the same encryption config to be read after a restore.
    async fn backup(&self, out: &std::path::Path) -> Result<crate::embedded::BackupInfo> {
        self.inner.backup(out).await
    }

    async fn current_revision(&self) -> Result<Revision> {
        self.inner.current_revision().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(providers: Value) -> EncryptionConfig {
        EncryptionConfig::from_json(&json!({"apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "EncryptionConfiguration",
            "resources": [{"resources": ["secrets"], "providers": providers}]}))
        .expect("config")
    }

    const KEY1: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="; // 32 bytes
    const KEY2: &str = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";

    #[test]
    fn secrets_are_sealed_and_opened_others_untouched() {
        let c = config(
            json!([{"aesgcm": {"keys": [{"name": "key1", "secret": KEY1}]}}, {"identity": {}}]),
        );
        let rng = SystemRandom::new();
        let key = b"/registry/secrets/ns/s";
        let plain = Bytes::from_static(b"{\"data\":{\"password\":\"czNjcjN0\"}}");
        let sealed = c.seal(&rng, key, plain.clone()).expect("seal");
        assert!(sealed.starts_with(b"k8s:enc:aesgcm:v1:key1:"));
        assert!(!sealed.windows(8).any(|w| w == b"czNjcjN0"), "no plaintext");
        // Two writes of the same value differ (a fresh nonce each).
        assert_ne!(sealed, c.seal(&rng, key, plain.clone()).expect("seal"));
        assert_eq!(c.open(key, sealed.clone()).expect("open"), plain);
        // Moved to another key, or altered: refused.
        let moved = c.open(b"/registry/secrets/ns/other", sealed.clone());
        assert!(moved.is_err());
        let mut bad = sealed.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(c.open(key, Bytes::from(bad)).is_err());
        // ConfigMaps are not in the config: stored as they are.
        let cm = Bytes::from_static(b"{}");
        assert_eq!(
            c.seal(&rng, b"/registry/configmaps/ns/c", cm.clone())
                .expect("seal"),
            cm
        );
        // Written before encryption: read through identity.
        assert_eq!(c.open(key, plain.clone()).expect("identity"), plain);
        // Without identity, plaintext is an error that says what to add.
        let strict = config(json!([{"aesgcm": {"keys": [{"name": "key1", "secret": KEY1}]}}]));
        let e = strict.open(key, plain).expect_err("no identity");
        assert!(e.to_string().contains("identity"), "{e}");
        // Rotation: a config with a new first key still reads the old one's values.
        let rotated = config(
            json!([{"aesgcm": {"keys": [{"name": "key2", "secret": KEY2},
            {"name": "key1", "secret": KEY1}]}}]),
        );
        assert!(rotated.open(key, sealed.clone()).is_ok());
        assert!(
            rotated
                .seal(&rng, key, Bytes::from_static(b"x"))
                .expect("seal")
                .starts_with(b"k8s:enc:aesgcm:v1:key2:")
        );
        let without = config(json!([{"aesgcm": {"keys": [{"name": "key2", "secret": KEY2}]}}]));
        let e = without.open(key, sealed).expect_err("unknown key");
        assert!(e.to_string().contains("\"key1\""), "{e}");
    }

    #[test]
    fn bad_configs_say_what_to_fix() {
        for (v, says) in [
            (json!({"kind": "Other"}), "kind must be"),
            (
                json!({"kind": "EncryptionConfiguration", "resources": [{"resources": ["secrets"],
                    "providers": [{"aescbc": {"keys": []}}]}]}),
                "\"aescbc\" is not supported",
            ),
            (
                json!({"kind": "EncryptionConfiguration", "resources": [{"resources": ["secrets"],
                    "providers": [{"aesgcm": {"keys": [{"name": "k", "secret": "c2hvcnQ="}]}}]}]}),
                "16 or 32 bytes",
            ),
            (
                json!({"kind": "EncryptionConfiguration", "resources": [{"resources": ["*.apps"],
                    "providers": [{"identity": {}}]}]}),
                "only \"*.*\"",
            ),
        ] {
            let e = EncryptionConfig::from_json(&v).expect_err("invalid");
            assert!(e.contains(says), "{e}");
        }
    }
}
