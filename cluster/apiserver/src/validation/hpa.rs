//! Validation of HorizontalPodAutoscalers (`autoscaling/v2`, after defaulting), with
//! Kubernetes' rules: a scale target with kind and name, `1 <= minReplicas <= maxReplicas`,
//! each metric of a known type carrying that type's source and only it, targets of the types
//! each source allows with positive amounts, and behavior rules within Kubernetes' bounds.

use serde_json::Value;
use tessera_core::quantity::Quantity;

use super::{Errors, label_selector, one_of, str_at};

/// The metric source types and the field each one's source is in.
const SOURCES: &[(&str, &str)] = &[
    ("Object", "object"),
    ("Pods", "pods"),
    ("Resource", "resource"),
    ("ContainerResource", "containerResource"),
    ("External", "external"),
];

/// Checks an HPA's spec.
pub(super) fn spec(spec: &Value, e: &mut Errors) {
    let target = &spec["scaleTargetRef"];
    for key in ["kind", "name"] {
        match str_at(target, key) {
            None | Some("") => e.required(&format!("spec.scaleTargetRef.{key}")),
            Some(v) => {
                if let Some(why) = path_segment(v) {
                    e.invalid(&format!("spec.scaleTargetRef.{key}"), &target[key], why);
                }
            }
        }
    }
    let min = spec["minReplicas"].as_i64().unwrap_or(1);
    if min < 1 {
        e.invalid(
            "spec.minReplicas",
            &spec["minReplicas"],
            "must be greater than or equal to 1",
        );
    }
    match spec["maxReplicas"].as_i64() {
        None => e.required("spec.maxReplicas"),
        Some(max) if max < min.max(1) => e.invalid(
            "spec.maxReplicas",
            &spec["maxReplicas"],
            "must be greater than or equal to `minReplicas` (and at least 1)",
        ),
        Some(_) => {}
    }
    for (i, m) in spec["metrics"].as_array().into_iter().flatten().enumerate() {
        metric(m, &format!("spec.metrics[{i}]"), e);
    }
    let behavior = &spec["behavior"];
    for direction in ["scaleUp", "scaleDown"] {
        if behavior[direction].is_object() {
            rules(
                &behavior[direction],
                &format!("spec.behavior.{direction}"),
                e,
            );
        }
    }
}

fn metric(m: &Value, at: &str, e: &mut Errors) {
    let Some(ty) = str_at(m, "type").filter(|t| !t.is_empty()) else {
        e.required(&format!("{at}.type"));
        return;
    };
    let Some(&(_, field)) = SOURCES.iter().find(|(t, _)| *t == ty) else {
        let types: Vec<&str> = SOURCES.iter().map(|(t, _)| *t).collect();
        e.not_supported(&format!("{at}.type"), &m["type"], &types);
        return;
    };
    for (_, other) in SOURCES.iter().filter(|(_, f)| *f != field) {
        if m.get(*other).is_some_and(|v| !v.is_null()) {
            e.invalid(
                &format!("{at}.{other}"),
                &Value::String("<object>".into()),
                format!("must populate the given metric source only: this metric's type is {ty}, whose source is `{field}`"),
            );
        }
    }
    let source = &m[field];
    let at = format!("{at}.{field}");
    if !source.is_object() {
        e.required(&at);
        return;
    }
    match ty {
        "Resource" | "ContainerResource" => {
            if str_at(source, "name").is_none_or(str::is_empty) {
                e.required(&format!("{at}.name"));
            }
            if ty == "ContainerResource" && str_at(source, "container").is_none_or(str::is_empty) {
                e.required(&format!("{at}.container"));
            }
        }
        _ => {
            let id = &source["metric"];
            if str_at(id, "name").is_none_or(str::is_empty) {
                e.required(&format!("{at}.metric.name"));
            }
            if id["selector"].is_object() {
                label_selector(&id["selector"], &format!("{at}.metric.selector"), e);
            }
            if ty == "Object" {
                let d = &source["describedObject"];
                for key in ["kind", "name"] {
                    if str_at(d, key).is_none_or(str::is_empty) {
                        e.required(&format!("{at}.describedObject.{key}"));
                    }
                }
            }
        }
    }
    let allowed: &[&str] = match ty {
        "Resource" | "ContainerResource" => &["Utilization", "AverageValue"],
        "Pods" => &["AverageValue"],
        _ => &["Value", "AverageValue"],
    };
    self::target(&source["target"], &format!("{at}.target"), allowed, e);
}

fn target(t: &Value, at: &str, allowed: &[&str], e: &mut Errors) {
    if !t.is_object() {
        e.required(at);
        return;
    }
    let Some(ty) = str_at(t, "type").filter(|t| !t.is_empty()) else {
        e.required(&format!("{at}.type"));
        return;
    };
    if !allowed.contains(&ty) {
        e.not_supported(&format!("{at}.type"), &t["type"], allowed);
        return;
    }
    match ty {
        "Utilization" => match t["averageUtilization"].as_i64() {
            None => e.required(&format!("{at}.averageUtilization")),
            Some(u) if u <= 0 => e.invalid(
                &format!("{at}.averageUtilization"),
                &t["averageUtilization"],
                "must be greater than 0",
            ),
            Some(_) => {}
        },
        _ => {
            let key = if ty == "Value" {
                "value"
            } else {
                "averageValue"
            };
            match t[key].as_str().map(str::parse::<Quantity>) {
                None => e.required(&format!("{at}.{key}")),
                Some(Ok(q)) if q.milli_ceil() > 0 => {}
                Some(_) => e.invalid(
                    &format!("{at}.{key}"),
                    &t[key],
                    "must be a quantity greater than 0",
                ),
            }
        }
    }
}

fn rules(r: &Value, at: &str, e: &mut Errors) {
    if let Some(w) = r.get("stabilizationWindowSeconds").filter(|w| !w.is_null())
        && !w.as_i64().is_some_and(|w| (0..=3600).contains(&w))
    {
        e.invalid(
            &format!("{at}.stabilizationWindowSeconds"),
            w,
            "must be between 0 and 3600 (one hour)",
        );
    }
    one_of(r, "selectPolicy", &["Max", "Min", "Disabled"], at, e);
    let policies = r["policies"].as_array().map_or(&[][..], Vec::as_slice);
    if policies.is_empty() {
        e.required(&format!("{at}.policies"));
    }
    for (i, p) in policies.iter().enumerate() {
        let at = format!("{at}.policies[{i}]");
        match str_at(p, "type") {
            None | Some("") => e.required(&format!("{at}.type")),
            Some("Pods" | "Percent") => {}
            Some(_) => e.not_supported(&format!("{at}.type"), &p["type"], &["Pods", "Percent"]),
        }
        if p["value"].as_i64().is_none_or(|v| v <= 0) {
            e.invalid(
                &format!("{at}.value"),
                &p["value"],
                "must be greater than 0",
            );
        }
        if !p["periodSeconds"]
            .as_i64()
            .is_some_and(|s| (1..=1800).contains(&s))
        {
            e.invalid(
                &format!("{at}.periodSeconds"),
                &p["periodSeconds"],
                "must be between 1 and 1800 (30 minutes)",
            );
        }
    }
}

/// Why `s` cannot be one segment of a URL path (as Kubernetes checks names in references).
fn path_segment(s: &str) -> Option<&'static str> {
    if s == "." || s == ".." {
        Some("may not be '.' or '..'")
    } else if s.contains('/') || s.contains('%') {
        Some("may not contain '/' or '%'")
    } else {
        None
    }
}
