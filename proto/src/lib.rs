//! Tessera's gRPC definitions: code generated from the `.proto` files beside this crate.

/// The standard gRPC health checking protocol.
pub mod health {
    /// Version 1.
    pub mod v1 {
        #![allow(missing_docs, clippy::all)]
        tonic::include_proto!("grpc.health.v1");
    }
}

/// The shard ↔ federation channel (`tessera.federation.v1`).
pub mod federation {
    /// Version 1.
    pub mod v1 {
        #![allow(missing_docs, clippy::all)]
        tonic::include_proto!("tessera.federation.v1");
    }
}

/// Resource offers for frameworks (`tessera.offers.v1`).
pub mod offers {
    /// Version 1.
    pub mod v1 {
        #![allow(missing_docs, clippy::all)]
        tonic::include_proto!("tessera.offers.v1");
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::health::v1::health_check_response::ServingStatus;
    use super::health::v1::{HealthCheckRequest, HealthCheckResponse};

    #[test]
    fn health_messages_match_the_wire_protocol() {
        // Probes compare these numbers, not names.
        assert_eq!(ServingStatus::Serving as i32, 1);
        assert_eq!(ServingStatus::NotServing as i32, 2);
        // Field 1, varint 1: what grpc_health_probe expects for SERVING.
        let bytes = HealthCheckResponse {
            status: ServingStatus::Serving as i32,
        }
        .encode_to_vec();
        assert_eq!(bytes, vec![0x08, 0x01]);
        let req = HealthCheckRequest::decode(&[0x0a, 0x01, b'x'][..]).expect("decode");
        assert_eq!(req.service, "x");
    }
}
