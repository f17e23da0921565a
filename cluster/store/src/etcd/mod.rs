//! The etcd backend: the Store trait over a real etcd v3 cluster through `etcd-client`.
//! Preconditions become etcd transaction compares; reads and idempotent requests are retried
//! with backoff while etcd is unreachable; watches resume after a lost stream from the last
//! revision they delivered, so nothing is missed or repeated.

mod watch;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse,
};

use crate::Store;
use crate::continuation::Cursor;
use crate::error::{PreconditionFailure, Result, StoreError};
use crate::metrics::StoreMetrics;
use crate::types::{
    KeyValue, LeaseId, ListRequest, ListResponse, Op, OpResult, Revision, TxnResponse, WatchStream,
};
use crate::validation::{check_key, check_prefix, check_ttl, check_txn, prefix_end};

/// How the etcd backend connects and retries.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// Member URLs of one etcd cluster, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Timeout of one request.
    pub request_timeout: Duration,
    /// How long reads and other idempotent requests are retried while etcd is unreachable.
    pub retry_for: Duration,
    /// How often an idle watch asks etcd for a progress notification.
    pub progress_interval: Duration,
    /// Client TLS for `https://` members; `None` for plain `http://`.
    pub tls: Option<EtcdTls>,
}

/// Client TLS towards etcd (kube-apiserver's `--etcd-cafile`, `--etcd-certfile`,
/// `--etcd-keyfile`), all PEM.
#[derive(Clone)]
pub struct EtcdTls {
    /// The CA that signs the members' serving certificates.
    pub ca_pem: String,
    /// A client certificate and its key, for members run with `--client-cert-auth`.
    pub identity: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("client_certificate", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

impl EtcdOptions {
    /// Options for one cluster with the defaults.
    pub fn new(endpoints: Vec<String>) -> Self {
        EtcdOptions {
            endpoints,
            request_timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(15),
            progress_interval: Duration::from_secs(5),
            tls: None,
        }
    }
}

/// A handle to one etcd cluster; clones share the connection.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    options: Arc<EtcdOptions>,
    metrics: Arc<StoreMetrics>,
    name: Arc<str>,
}

impl EtcdStore {
    /// Connects (lazily: an unreachable etcd is reported by the first request, not here).
    pub async fn connect(options: EtcdOptions, metrics: Arc<StoreMetrics>) -> Result<EtcdStore> {
        if options.endpoints.is_empty() {
            return Err(StoreError::Unavailable {
                backend: "etcd".into(),
                op: "connect",
                source: "no etcd endpoints given".into(),
            });
        }
        let mut connect = ConnectOptions::new()
            .with_timeout(options.request_timeout)
            .with_connect_timeout(Duration::from_secs(2))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true);
        if let Some(tls) = &options.tls {
            if let Some(plain) = options.endpoints.iter().find(|e| e.starts_with("http://")) {
                return Err(StoreError::Unavailable {
                    backend: options.endpoints.join(","),
                    op: "connect",
                    source: format!(
                        "{plain}: etcd TLS is configured, so every member must be an https:// URL"
                    )
                    .into(),
                });
            }
            let mut config = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(etcd_client::Identity::from_pem(cert, key));
            }
            connect = connect.with_tls(config);
        }
        let client = Client::connect(&options.endpoints, Some(connect))
            .await
            .map_err(|e| StoreError::Unavailable {
                backend: options.endpoints.join(","),
                op: "connect",
                source: Box::new(e),
            })?;
        Ok(EtcdStore {
            client,
            name: options.endpoints.join(",").into(),
            options: Arc::new(options),
            metrics,
        })
    }

    /// The raw client, for benchmarks that compare against it.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Runs a write `call`, again only while it fails without having been sent
    /// ([`never_sent`]), for at most `retry_for`.
    async fn unsent_retry<T, F, Fut>(
        &self,
        op: &'static str,
        call: F,
    ) -> std::result::Result<T, etcd_client::Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.retry_while(
            op,
            never_sent,
            "etcd member not reachable, the write not sent; retrying",
            call,
        )
        .await
    }

    /// Runs `call` until it succeeds, fails for a reason other than reachability, or
    /// `retry_for` has passed. Only for requests that are safe to repeat.
    async fn retry<T, F, Fut>(&self, op: &'static str, call: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.retry_while(op, is_transient, "etcd unreachable; retrying", call)
            .await
            .map_err(|e| map_error(&self.name, op, e))
    }

    /// Runs `call` again, with backoff (50 ms doubling to 1 s), while it fails with an error
    /// `worth` retrying and `retry_for` has not passed; counts and logs each retry.
    async fn retry_while<T, F, Fut>(
        &self,
        op: &'static str,
        worth: fn(&etcd_client::Error) -> bool,
        what: &'static str,
        mut call: F,
    ) -> std::result::Result<T, etcd_client::Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.options.retry_for;
        let mut backoff = Duration::from_millis(50);
        loop {
            match call(self.client.clone()).await {
                Err(e) if worth(&e) && tokio::time::Instant::now() < deadline => {
                    self.metrics.retries.with_label_values(&["etcd", op]).inc();
                    tracing::warn!(op, error = %e, backoff_ms = backoff.as_millis() as u64, endpoints = %self.name, "{what}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                r => return r,
            }
        }
    }
}

/// True when `e` says the request never left this process: no connection to the member could
/// be made (refused, unreachable), so nothing can have been applied and a write may be sent
/// again. A connection lost after sending is not this.
pub(crate) fn never_sent(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(s) = e else {
        return false;
    };
    if s.code() != tonic::Code::Unavailable {
        return false;
    }
    let mut source = std::error::Error::source(s);
    while let Some(cause) = source {
        if format!("{cause:?}").contains("ConnectError") {
            return true;
        }
        source = cause.source();
    }
    s.message().contains("tcp connect error")
}

/// True for failures of reachability (worth retrying), false for answers. A `Cancelled`
/// that carries a transport error is the client's channel giving up a request whose
/// connection closed under it (seen when etcd restarts mid-request), not etcd's answer.
pub(crate) fn is_transient(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(s) => {
            let dropped =
                s.code() == tonic::Code::Cancelled && std::error::Error::source(s).is_some();
            (dropped
                || matches!(
                    s.code(),
                    tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown
                ))
                && !s.message().contains("mvcc")
        }
        _ => false,
    }
}

/// Turns etcd's answers into the store's errors.
pub(crate) fn map_error(backend: &str, op: &'static str, e: etcd_client::Error) -> StoreError {
    if let etcd_client::Error::LeaseKeepAliveError(msg) = &e
        && msg.contains("lease not found")
    {
        return StoreError::LeaseNotFound(-1);
    }
    if let etcd_client::Error::GRpcStatus(s) = &e {
        let msg = s.message();
        if msg.contains("required revision has been compacted") {
            return StoreError::Compacted {
                requested: -1,
                compacted: -1,
            };
        }
        if msg.contains("required revision is a future revision") {
            return StoreError::FutureRevision {
                requested: -1,
                current: -1,
            };
        }
        if msg.contains("requested lease not found") {
            return StoreError::LeaseNotFound(-1);
        }
        if msg.contains("request is too large") {
            return StoreError::RequestTooLarge {
                size: 0,
                limit: crate::validation::MAX_REQUEST_BYTES,
            };
        }
        if msg.contains("too many operations in txn request") {
            return StoreError::TooManyOps {
                count: 0,
                limit: crate::validation::MAX_TXN_OPS,
            };
        }
    }
    StoreError::Unavailable {
        backend: backend.to_owned(),
        op,
        source: Box::new(e),
    }
}

pub(crate) fn convert_kv(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: Bytes::copy_from_slice(kv.key()),
        value: Bytes::copy_from_slice(kv.value()),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    }
}

/// Fills in the revision a request asked for (etcd's error text does not carry it).
fn at_revision(e: StoreError, requested: i64) -> StoreError {
    match e {
        StoreError::Compacted { .. } => StoreError::Compacted {
            requested,
            compacted: -1,
        },
        StoreError::FutureRevision { .. } => StoreError::FutureRevision {
            requested,
            current: -1,
        },
        e => e,
    }
}

fn header_revision(h: Option<&etcd_client::ResponseHeader>) -> i64 {
    h.map_or(0, |h| h.revision())
}

/// Finds which operation's precondition failed, from the keys' values read in the same
/// etcd transaction (its `else` branch), so the answer is exact.
fn explain_failure(ops: &[Op], current: &[Option<KeyValue>]) -> StoreError {
    for (index, (op, cur)) in ops.iter().zip(current).enumerate() {
        let kind = op.precondition_failure(cur.as_ref());
        if let Some(kind) = kind {
            return StoreError::PreconditionFailed(Box::new(PreconditionFailure {
                index,
                key: op.key().clone(),
                kind,
                current: cur.clone(),
            }));
        }
    }
    // Every compare held when re-checked: the failing compare must have been a lease that
    // vanished between the read and the write.
    StoreError::LeaseNotFound(ops.iter().map(Op::lease).find(|l| *l != 0).unwrap_or(0))
}

#[async_trait]
impl Store for EtcdStore {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        check_key(key)?;
        let resp = self
            .retry("get", |mut c| {
                let key = key.to_vec();
                async move { c.get(key, None).await }
            })
            .await?;
        Ok(resp.kvs().first().map(convert_kv))
    }

    async fn list(&self, req: ListRequest) -> Result<ListResponse> {
        let cursor = Cursor::from_request(&req)?;
        check_prefix(&cursor.prefix)?;
        let revision = match &cursor.revision {
            Some(r) => r.expect_single()?,
            None => 0,
        };
        let mut opts = GetOptions::new().with_revision(revision);
        opts = match prefix_end(&cursor.prefix) {
            Some(end) => opts.with_range(end),
            None => opts.with_from_key(),
        };
        if req.limit > 0 {
            opts = opts.with_limit(req.limit as i64);
        }
        let start = if cursor.start < cursor.prefix {
            cursor.prefix.clone()
        } else {
            cursor.start.clone()
        };
        let resp = self
            .retry("list", |mut c| {
                let start = start.to_vec();
                let opts = opts.clone();
                async move { c.get(start, Some(opts)).await }
            })
            .await
            .map_err(|e| at_revision(e, revision))?;
        let read_at = if revision > 0 {
            revision
        } else {
            header_revision(resp.header())
        };
        let kvs: Vec<KeyValue> = resp.kvs().iter().map(convert_kv).collect();
        Ok(cursor.page(kvs, Revision::single(read_at), resp.more()))
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<TxnResponse> {
        check_txn(&ops)?;
        if let [Op::Put { key, value, lease }] = ops.as_slice() {
            // An unconditional single write needs no transaction: etcd's put is cheaper.
            return self.single_put(key.clone(), value.clone(), *lease).await;
        }
        let mut compares = Vec::with_capacity(ops.len());
        let mut then = Vec::with_capacity(ops.len());
        let mut otherwise = Vec::with_capacity(ops.len());
        for op in &ops {
            let key = op.key().to_vec();
            match op {
                Op::Create { value, lease, .. } => {
                    compares.push(Compare::create_revision(key.clone(), CompareOp::Equal, 0));
                    // The key is new, so there is no previous value to ask etcd for.
                    let opts = if *lease != 0 {
                        PutOptions::new().with_lease(*lease)
                    } else {
                        PutOptions::new()
                    };
                    then.push(TxnOp::put(key.clone(), value.to_vec(), Some(opts)));
                }
                Op::Update {
                    value,
                    expected,
                    lease,
                    ..
                } => {
                    compares.push(Compare::mod_revision(
                        key.clone(),
                        CompareOp::Equal,
                        *expected,
                    ));
                    then.push(TxnOp::put(
                        key.clone(),
                        value.to_vec(),
                        Some(put_opts(*lease)),
                    ));
                }
                Op::Put { value, lease, .. } => {
                    then.push(TxnOp::put(
                        key.clone(),
                        value.to_vec(),
                        Some(put_opts(*lease)),
                    ));
                }
                Op::Delete { expected, .. } => {
                    compares.push(match expected {
                        Some(rev) => Compare::mod_revision(key.clone(), CompareOp::Equal, *rev),
                        None => Compare::version(key.clone(), CompareOp::Greater, 0),
                    });
                    then.push(TxnOp::delete(
                        key.clone(),
                        Some(DeleteOptions::new().with_prev_key()),
                    ));
                }
                Op::Check { expected, .. } => {
                    compares.push(Compare::mod_revision(
                        key.clone(),
                        CompareOp::Equal,
                        *expected,
                    ));
                }
            }
            otherwise.push(TxnOp::get(key, None));
        }
        let writes = !then.is_empty();
        if !writes {
            // A transaction of checks only: read them back in the success branch too.
            then = otherwise.clone();
        }
        let txn = Txn::new().when(compares).and_then(then).or_else(otherwise);
        // Writes are not retried once sent: after a lost connection the outcome is unknown,
        // and the caller must read before deciding (Kubernetes' storage layer does the same).
        // One that could not be sent at all (no connection to the member the client picked)
        // is tried again.
        let resp = self
            .unsent_retry("txn", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
            .map_err(|e| match map_error(&self.name, "txn", e) {
                StoreError::LeaseNotFound(_) => StoreError::LeaseNotFound(
                    ops.iter().map(Op::lease).find(|l| *l != 0).unwrap_or(0),
                ),
                e => e,
            })?;
        let revision = header_revision(resp.header());
        let responses = resp.op_responses();
        if !resp.succeeded() {
            let current: Vec<Option<KeyValue>> = responses
                .iter()
                .map(|r| match r {
                    TxnOpResponse::Get(g) => g.kvs().first().map(convert_kv),
                    _ => None,
                })
                .collect();
            return Err(explain_failure(&ops, &current));
        }
        if !writes {
            return Ok(TxnResponse {
                revision,
                results: vec![OpResult::Checked; ops.len()],
            });
        }
        let mut responses = responses.into_iter();
        let mut results = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                Op::Check { .. } => results.push(OpResult::Checked),
                Op::Delete { .. } => match responses.next() {
                    Some(TxnOpResponse::Delete(d)) => match d.prev_kvs().first() {
                        Some(prev) => results.push(OpResult::Deleted(convert_kv(prev))),
                        None => return Err(StoreError::Internal("etcd deleted nothing".into())),
                    },
                    other => {
                        return Err(StoreError::Internal(format!(
                            "etcd answered a delete with {other:?}"
                        )));
                    }
                },
                Op::Create { key, value, lease }
                | Op::Update {
                    key, value, lease, ..
                }
                | Op::Put { key, value, lease } => match responses.next() {
                    Some(TxnOpResponse::Put(p)) => {
                        let prev = p.prev_key();
                        results.push(OpResult::Written(KeyValue {
                            key,
                            value,
                            create_revision: prev.map_or(revision, |p| p.create_revision()),
                            mod_revision: revision,
                            version: prev.map_or(1, |p| p.version() + 1),
                            lease,
                        }));
                    }
                    other => {
                        return Err(StoreError::Internal(format!(
                            "etcd answered a put with {other:?}"
                        )));
                    }
                },
            }
        }
        Ok(TxnResponse { revision, results })
    }

    async fn watch(&self, prefix: &[u8], after: Option<Revision>) -> Result<WatchStream> {
        check_prefix(prefix)?;
        let current = self.current_revision().await?.expect_single()?;
        let after = match after {
            Some(r) => r.expect_single()?,
            None => current,
        };
        if after > current {
            // etcd would wait for it; refuse as the embedded store does.
            return Err(StoreError::FutureRevision {
                requested: after,
                current,
            });
        }
        watch::open(self.clone(), Bytes::copy_from_slice(prefix), after).await
    }

    async fn lease_grant(&self, ttl: i64) -> Result<LeaseId> {
        check_ttl(ttl)?;
        let resp = self
            .retry("lease_grant", |mut c| async move {
                c.lease_grant(ttl, None).await
            })
            .await?;
        Ok(resp.id())
    }

    async fn lease_keep_alive(&self, id: LeaseId) -> Result<i64> {
        let ttl = self
            .retry("lease_keep_alive", |mut c| async move {
                let (mut keeper, mut stream) = c.lease_keep_alive(id).await?;
                keeper.keep_alive().await?;
                Ok(stream.message().await?.map_or(0, |r| r.ttl()))
            })
            .await
            .map_err(|e| match e {
                StoreError::LeaseNotFound(_) => StoreError::LeaseNotFound(id),
                e => e,
            })?;
        if ttl <= 0 {
            return Err(StoreError::LeaseNotFound(id));
        }
        Ok(ttl)
    }

    async fn lease_revoke(&self, id: LeaseId) -> Result<()> {
        self.retry(
            "lease_revoke",
            |mut c| async move { c.lease_revoke(id).await },
        )
        .await
        .map_err(|e| match e {
            StoreError::LeaseNotFound(_) => StoreError::LeaseNotFound(id),
            e => e,
        })?;
        Ok(())
    }

    async fn compact(&self, revision: &Revision) -> Result<()> {
        let rev = revision.expect_single()?;
        self.retry("compact", |mut c| async move { c.compact(rev, None).await })
            .await
            .map_err(|e| at_revision(e, rev))?;
        self.metrics
            .compacted_revision
            .with_label_values(&["etcd"])
            .set(rev);
        Ok(())
    }

    async fn current_revision(&self) -> Result<Revision> {
        // A range over one key that cannot exist returns only the header.
        let resp = self
            .retry("current_revision", |mut c| async move {
                c.get(vec![0u8], Some(GetOptions::new().with_count_only()))
                    .await
            })
            .await?;
        let rev = header_revision(resp.header());
        self.metrics.revision.with_label_values(&["etcd"]).set(rev);
        Ok(Revision::single(rev))
    }
}

impl EtcdStore {
    async fn single_put(&self, key: Bytes, value: Bytes, lease: LeaseId) -> Result<TxnResponse> {
        let resp = self
            .unsent_retry("txn", |mut c| {
                let (key, value) = (key.to_vec(), value.to_vec());
                async move { c.put(key, value, Some(put_opts(lease))).await }
            })
            .await
            .map_err(|e| match map_error(&self.name, "txn", e) {
                StoreError::LeaseNotFound(_) => StoreError::LeaseNotFound(lease),
                e => e,
            })?;
        let revision = header_revision(resp.header());
        let prev = resp.prev_key();
        let kv = KeyValue {
            key,
            value,
            create_revision: prev.map_or(revision, |p| p.create_revision()),
            mod_revision: revision,
            version: prev.map_or(1, |p| p.version() + 1),
            lease,
        };
        Ok(TxnResponse {
            revision,
            results: vec![OpResult::Written(kv)],
        })
    }
}

fn put_opts(lease: LeaseId) -> PutOptions {
    let opts = PutOptions::new().with_prev_key();
    if lease != 0 {
        opts.with_lease(lease)
    } else {
        opts
    }
}
