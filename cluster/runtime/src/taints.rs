//! Taints and tolerations, by Kubernetes' rules — shared by the scheduler (which pods may go
//! where) and the node lifecycle controller (which pods leave an unreachable node).

use k8s_openapi::api::core::v1::{Taint, Toleration};

/// True if `t` tolerates `taint`: an empty effect matches every effect; an empty key with
/// `Exists` matches every taint; `Equal` (the default) compares values.
pub fn toleration_matches(t: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    let key = t.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        _ => {
            key == taint.key
                && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
    }
}

/// True if some toleration tolerates `taint`.
pub fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| toleration_matches(t, taint))
}
