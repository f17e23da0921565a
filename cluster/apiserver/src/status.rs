//! Kubernetes `Status` objects: every error the API answers is one, with a reason and a
//! message that tells a person what to fix.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// `plural` or `plural.group`, as Kubernetes names a resource in messages.
fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{group}")
    }
}

/// An API error, answered as a `Status`.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP code.
    pub code: StatusCode,
    /// Kubernetes' reason (`NotFound`, `AlreadyExists`, ...).
    pub reason: &'static str,
    /// What went wrong and what to do.
    pub message: String,
    /// `details` (name, group, kind), when it concerns one object.
    pub details: Option<Value>,
}

impl ApiError {
    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            code: StatusCode::BAD_REQUEST,
            reason: "BadRequest",
            message: message.into(),
            details: None,
        }
    }

    /// 404 NotFound for an object.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let what = qualified(group, plural);
        ApiError {
            code: StatusCode::NOT_FOUND,
            reason: "NotFound",
            message: format!("{what} \"{name}\" not found"),
            details: Some(json!({"name": name, "group": group, "kind": plural})),
        }
    }

    /// 409 AlreadyExists.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let what = qualified(group, plural);
        ApiError {
            code: StatusCode::CONFLICT,
            reason: "AlreadyExists",
            message: format!("{what} \"{name}\" already exists"),
            details: Some(json!({"name": name, "group": group, "kind": plural})),
        }
    }

    /// 409 Conflict: the object changed since the client read it.
    pub fn conflict(group: &str, plural: &str, name: &str) -> Self {
        let what = qualified(group, plural);
        ApiError {
            code: StatusCode::CONFLICT,
            reason: "Conflict",
            message: format!(
                "Operation cannot be fulfilled on {what} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
            details: Some(json!({"name": name, "group": group, "kind": plural})),
        }
    }

    /// 422 Invalid.
    pub fn invalid(kind: &str, name: &str, field: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        ApiError {
            code: StatusCode::UNPROCESSABLE_ENTITY,
            reason: "Invalid",
            message: format!(
                "{kind} \"{name}\" is invalid: {field}: Invalid value: \"{name}\": {message}"
            ),
            details: Some(json!({
                "name": name,
                "kind": kind,
                "causes": [{"reason": "FieldValueInvalid", "message": format!("Invalid value: \"{name}\": {message}"), "field": field}],
            })),
        }
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        ApiError {
            code: StatusCode::METHOD_NOT_ALLOWED,
            reason: "MethodNotAllowed",
            message: message.into(),
            details: None,
        }
    }

    /// 500 InternalError (the store failed; the message says how).
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            code: StatusCode::INTERNAL_SERVER_ERROR,
            reason: "InternalError",
            message: message.into(),
            details: None,
        }
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code.as_u16(),
        });
        if let Some(d) = &self.details {
            status["details"] = d.clone();
        }
        status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.code,
            [(header::CONTENT_TYPE, "application/json")],
            self.to_status().to_string(),
        )
            .into_response()
    }
}
