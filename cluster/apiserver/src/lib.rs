//! A Tessera shard's Kubernetes API server. Built up issue by issue; today: the catalog of
//! the kinds it serves, API discovery (`/version`, `/api`, `/apis`, aggregated and legacy),
//! TLS from a generated CA, bearer-token authentication and the kubeconfig for kubectl —
//! enough for `kubectl api-resources` and `kubectl api-versions`.

pub mod catalog;
pub mod discovery;
pub mod pki;
pub mod rest;
pub mod serve;
pub mod status;
