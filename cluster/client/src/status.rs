//! Kubernetes `Status` objects: every error the API answers is one, with a reason and a
//! message that tells a person what to fix.

use serde_json::{Value, json};

/// `plural` or `plural.group`, as Kubernetes names a resource in messages.
pub fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{group}")
    }
}

/// `Kind` or `Kind.group`, as Kubernetes names a kind in validation messages.
pub fn qualified_kind(group: &str, kind: &str) -> String {
    if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    }
}

/// One invalid field, as a `StatusCause`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueDuplicate`,
    /// `FieldValueNotSupported`, `FieldValueTooLong`, `FieldValueForbidden`, `FieldManagerConflict`.
    pub reason: &'static str,
    /// The field path (`spec.template.spec.containers[0].image`).
    pub field: String,
    /// What is wrong, in Kubernetes' words (`Required value`, `Invalid value: "x": ...`).
    pub message: String,
}

/// `StatusDetails` naming an object; empty fields are left out, as Kubernetes' `omitempty`
/// leaves them (the core group is "").
fn details(name: &str, group: &str, kind: &str) -> Value {
    let mut d = serde_json::Map::new();
    for (k, v) in [("name", name), ("group", group), ("kind", kind)] {
        if !v.is_empty() {
            d.insert(k.into(), json!(v));
        }
    }
    Value::Object(d)
}

/// An API error, answered as a `Status`.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP code.
    pub code: u16,
    /// Kubernetes' reason (`NotFound`, `AlreadyExists`, ...).
    pub reason: &'static str,
    /// What went wrong and what to do.
    pub message: String,
    /// `details` (name, group, kind, causes), when it concerns one object.
    pub details: Option<Value>,
    /// Seconds to wait before retrying (429, 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with a code, a reason and a message.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    fn about(mut self, group: &str, plural: &str, name: &str) -> Self {
        self.details = Some(details(name, group, plural));
        self
    }

    /// 404 NotFound for an object.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let what = qualified(group, plural);
        Self::new(404, "NotFound", format!("{what} \"{name}\" not found"))
            .about(group, plural, name)
    }

    /// 409 AlreadyExists.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let what = qualified(group, plural);
        Self::new(
            409,
            "AlreadyExists",
            format!("{what} \"{name}\" already exists"),
        )
        .about(group, plural, name)
    }

    /// 409 Conflict: the object changed since the client read it.
    pub fn conflict(group: &str, plural: &str, name: &str) -> Self {
        let what = qualified(group, plural);
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {what} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        )
        .about(group, plural, name)
    }

    /// 409 Conflict with a message of the caller's.
    pub fn conflict_because(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let what = qualified(group, plural);
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {what} \"{name}\": {why}"),
        )
        .about(group, plural, name)
    }

    /// 422 Invalid, one cause per field, in Kubernetes' message format.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let parts: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let list = if parts.len() == 1 {
            parts[0].clone()
        } else {
            format!("[{}]", parts.join(", "))
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!(
                "{} \"{name}\" is invalid: {list}",
                qualified_kind(group, kind)
            ),
        );
        let mut d = details(name, group, kind);
        d["causes"] = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        e.details = Some(d);
        e
    }

    /// 403 Forbidden, saying who may not do what, and why.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 410 Gone: the resourceVersion asked for was compacted away.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 429 TooManyRequests with `Retry-After`.
    pub fn too_many_requests(message: impl Into<String>, retry_after: u64) -> Self {
        let mut e = Self::new(429, "TooManyRequests", message);
        e.retry_after = Some(retry_after);
        e.details = Some(json!({"retryAfterSeconds": retry_after}));
        e
    }

    /// 500 InternalError (the store failed; the message says how).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
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
            "code": self.code,
        });
        if let Some(d) = &self.details {
            status["details"] = d.clone();
        }
        status
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.reason, self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_lists_every_cause_like_kubernetes() {
        let one = ApiError::invalid(
            "apps",
            "Deployment",
            "web",
            vec![Cause {
                reason: "FieldValueRequired",
                field: "spec.selector".into(),
                message: "Required value".into(),
            }],
        );
        assert_eq!(
            one.message,
            "Deployment.apps \"web\" is invalid: spec.selector: Required value"
        );
        let two = ApiError::invalid(
            "",
            "Pod",
            "p",
            vec![
                Cause {
                    reason: "FieldValueRequired",
                    field: "a".into(),
                    message: "Required value".into(),
                },
                Cause {
                    reason: "FieldValueInvalid",
                    field: "b".into(),
                    message: "Invalid value: -1: must be at least 0".into(),
                },
            ],
        );
        assert_eq!(
            two.message,
            "Pod \"p\" is invalid: [a: Required value, b: Invalid value: -1: must be at least 0]"
        );
        assert_eq!(two.to_status()["details"]["causes"][1]["field"], "b");
        assert_eq!(two.to_status()["code"], 422);
    }
}
