//! The shard's controllers, each a small reconcile on the controller runtime with its own
//! watches and work queue, so a slow controller never stalls another.

pub mod clock;
pub mod clusterrole_aggregation;
pub mod context;
pub mod cron;
pub mod cronjob;
pub mod csrsigning;
pub mod daemonset;
pub mod deployment;
pub mod endpoints;
pub mod fence;
pub mod gc;
pub mod history;
pub mod hpa;
pub mod job;
pub mod namespace;
pub mod nodelifecycle;
pub mod podgroup;
pub mod pods;
pub mod replicaset;
pub mod resourcequota;
pub mod rootca;
pub mod serviceaccount;
pub mod statefulset;
pub mod volumes;

pub use context::Context;

/// The controllers' timings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The node lifecycle controller's.
    pub nodes: nodelifecycle::NodeLifecycleConfig,
    /// How often every ResourceQuota is recounted.
    pub quota_resync: std::time::Duration,
    /// The CA bundle (PEM) published in every namespace as `kube-root-ca.crt`; without one
    /// the publisher does not run.
    pub root_ca: Option<String>,
    /// The HorizontalPodAutoscaler controller's.
    pub hpa: hpa::HpaConfig,
    /// The HorizontalPodAutoscaler controller's metrics, if they are served.
    pub hpa_metrics: Option<hpa::HpaMetrics>,
    /// What signs approved `kubernetes.io/kube-apiserver-client` requests; without one the
    /// signing controller does not run (requests wait for another signer).
    pub csr_signer: Option<std::sync::Arc<dyn csrsigning::CertificateSigner>>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            nodes: nodelifecycle::NodeLifecycleConfig::default(),
            quota_resync: resourcequota::DEFAULT_RESYNC,
            root_ca: None,
            hpa: hpa::HpaConfig::default(),
            hpa_metrics: None,
            csr_signer: None,
        }
    }
}

/// The names of the controllers [`run_all_with`] runs with `settings`, as logs and the
/// `tessera up` banner show them.
pub fn names(settings: &Settings) -> Vec<&'static str> {
    let mut names = vec![
        replicaset::NAME,
        <k8s_openapi::api::core::v1::ReplicationController as replicaset::SetKind>::CONTROLLER,
        deployment::NAME,
        daemonset::NAME,
        statefulset::NAME,
        endpoints::NAME,
        gc::NAME,
        job::NAME,
        cronjob::NAME,
        namespace::NAME,
        nodelifecycle::NAME,
        podgroup::NAME,
        resourcequota::NAME,
        serviceaccount::NAME,
        fence::NAME,
        clusterrole_aggregation::NAME,
        volumes::NAME,
        hpa::NAME,
    ];
    if settings.root_ca.is_some() {
        names.push(rootca::NAME);
    }
    if settings.csr_signer.is_some() {
        names.push(csrsigning::NAME);
    }
    names
}

/// Every controller, each with its own watches, queue and workers, until dropped.
pub async fn run_all(ctx: Context) {
    run_all_with(ctx, Settings::default()).await;
}

/// [`run_all`] with these timings.
pub async fn run_all_with(ctx: Context, settings: Settings) {
    tokio::join!(
        replicaset::run(ctx.clone()),
        replicaset::run_kind::<k8s_openapi::api::core::v1::ReplicationController>(ctx.clone()),
        deployment::run(ctx.clone()),
        daemonset::run(ctx.clone()),
        statefulset::run(ctx.clone()),
        endpoints::run(ctx.clone()),
        gc::run(ctx.clone()),
        job::run(ctx.clone()),
        cronjob::run(ctx.clone()),
        namespace::run(ctx.clone()),
        nodelifecycle::run(ctx.clone(), settings.nodes),
        podgroup::run(ctx.clone()),
        resourcequota::run(ctx.clone(), settings.quota_resync),
        serviceaccount::run(ctx.clone()),
        fence::run(ctx.clone()),
        clusterrole_aggregation::run(ctx.clone()),
        volumes::run(ctx.clone()),
        hpa::run(ctx.clone(), settings.hpa, settings.hpa_metrics),
        async {
            if let Some(bundle) = settings.root_ca {
                rootca::run(ctx.clone(), bundle).await;
            }
        },
        async {
            if let Some(signer) = settings.csr_signer {
                csrsigning::run(ctx.clone(), signer).await;
            }
        },
    );
}
