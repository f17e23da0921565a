//! Tessera's gRPC definitions: code generated from the `.proto` files beside this crate.

/// The standard gRPC health checking protocol.
pub mod health {
    /// Version 1.
    pub mod v1 {
        #![allow(missing_docs, clippy::all)]
        tonic::include_proto!("grpc.health.v1");
    }
}
