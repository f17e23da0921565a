//! A Tessera shard's Kubernetes API server.
//!
//! The request path is a layer of its own ([`api::Api`]: authorize → decode → admit → store →
//! encode) that in-process components call through [`client::Client`]; [`http`] wraps it for
//! kubectl and every other HTTP client, over TLS ([`serve`]) with bearer tokens ([`auth`]).

pub mod access_review;
pub mod aggregator;
pub mod api;
pub mod apiservices;
pub mod apply;
pub mod auth;
pub mod cel;
pub mod client;
pub mod client_certs;
pub mod crd;
pub mod csr;
pub mod defaults;
pub mod discovery;
pub mod fairness;
pub(crate) mod follow;
#[rustfmt::skip]
pub mod field_order;
pub mod http;
pub mod kinds;
pub mod metrics;
pub mod openapi;
pub mod order;
pub mod patch;
pub mod pki;
pub mod protobuf;
#[rustfmt::skip]
pub mod protobuf_schema;
pub mod rbac;
pub mod serve;
pub mod table;
pub mod token_review;
pub mod validation;
pub mod watchcache;
pub mod webhooks;

pub use tessera_client::{catalog, quota, request, status, types, yaml};
