//! A Tessera shard's Kubernetes API server. Built up issue by issue; today: the catalog of
//! the kinds it serves and API discovery (`/version`, `/api`, `/apis`, aggregated and legacy),
//! enough for `kubectl api-resources` and `kubectl api-versions`.

pub mod catalog;
pub mod discovery;
