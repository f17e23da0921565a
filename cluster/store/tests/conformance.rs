//! The conformance suite run against every backend: embedded (plain, and with every value
//! encrypted at rest), a real etcd process, and the sharded store over embedded stores and
//! over two real etcd processes.

use tessera_store::testing::conformance as c;
use tessera_store::testing::{
    EmbeddedHarness, EncryptedEmbeddedHarness, EtcdHarness, Harness, ShardedEmbeddedHarness,
    ShardedEtcdHarness,
};

macro_rules! suite {
    ($backend:ident, $harness:ty, $model_cases:expr) => {
        mod $backend {
            use super::*;

            async fn harness() -> $harness {
                <$harness>::new().await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn crud() {
                c::crud(harness().await.store()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn transactions() {
                c::transactions(harness().await.store()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn invalid_input() {
                c::invalid_input(harness().await.store()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn pagination_under_writes() {
                c::pagination_under_writes(harness().await.store()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_cas_increments() {
                c::concurrent_cas_increments(harness().await.store()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn watch_completeness() {
                c::watch_completeness(harness().await.store()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn progress_notifications() {
                c::progress_notifications(harness().await.store()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn compaction() {
                c::compaction(harness().await.store()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn leases() {
                c::leases(harness().await.store()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn restart_loses_nothing() {
                let mut h = harness().await;
                c::restart_loses_nothing(&mut h).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn matches_model() {
                c::matches_model(harness().await.store(), $model_cases).await;
            }
        }
    };
}

suite!(embedded, EmbeddedHarness, 256);
suite!(encrypted_embedded, EncryptedEmbeddedHarness, 64);
suite!(etcd, EtcdHarness, 64);
suite!(sharded_embedded, ShardedEmbeddedHarness, 128);
suite!(sharded_etcd, ShardedEtcdHarness, 32);
