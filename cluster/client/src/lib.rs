//! The client side of a Tessera API, beside the server as kube-rs's `kube-client` is:
//! requests ([`request::ApiRequest`], verbs, patch types, parameters), answers
//! ([`response::ApiResponse`], watch events), `Status` errors ([`status::ApiError`]), the
//! resource catalog ([`catalog`]), Tessera's own kinds ([`types`]), and the [`client::Client`]
//! trait with its HTTPS implementation. Controllers, the scheduler, node agents and the
//! federation depend on this crate, not on the API server.

pub mod auth;
pub mod catalog;
pub mod client;
pub mod quota;
pub mod request;
pub mod response;
pub mod status;
pub mod types;
pub mod workloads;
pub mod yaml;
