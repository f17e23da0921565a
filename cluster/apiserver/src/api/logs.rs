//! `pods/log`: the API server finds the pod's node and asks that node's agent for the
//! container's output ([`super::agents`]), as kube-apiserver asks the kubelet. The request
//! carries the pod's UID, so a pod deleted and created again under the same name never shows
//! the old one's output. The answer streams through as it comes (`follow`).

use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::Value;

use super::{Api, ApiResponse};
use crate::request::ApiRequest;
use crate::status::ApiError;

/// The container a log read is for: the one named, or the pod's only one.
pub(super) fn container_of(
    pod: &Value,
    name: &str,
    asked: Option<&str>,
) -> Result<String, ApiError> {
    let names = |field: &str| -> Vec<String> {
        pod["spec"][field]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let containers = names("containers");
    let init = names("initContainers");
    match asked {
        Some(c) if containers.iter().chain(&init).any(|n| n == c) => Ok(c.to_owned()),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}: its containers are [{}]",
            containers.join(" ")
        ))),
        None if containers.len() == 1 => Ok(containers[0].clone()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            containers.join(" ")
        ))),
    }
}

impl Api {
    /// `GET .../pods/NAME/log`.
    pub(super) async fn logs(&self, req: &ApiRequest) -> Result<ApiResponse, ApiError> {
        let opts = &req.params.log;
        let name = req.name.as_deref().unwrap_or_default();
        if let Some(why) = opts.problems() {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!("PodLogOptions \"{name}\" is invalid: {why}"),
            ));
        }
        let pod = self.get(req).await?.into_value().unwrap_or(Value::Null);
        let container = container_of(&pod, name, opts.container.as_deref())?;
        let Some(node_name) = pod["spec"]["nodeName"].as_str() else {
            return Err(ApiError::bad_request(format!(
                "pod {name} does not have a host assigned: it has not been scheduled yet (kubectl describe pod {name} tells why)"
            )));
        };
        let ns = req.namespace.as_deref().unwrap_or_default();
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let mut query = format!("podUID={uid}");
        let rest = opts.to_query();
        if !rest.is_empty() {
            query.push('&');
            query.push_str(&rest);
        }
        let resp = self
            .agent_get(
                node_name,
                &format!("/containerLogs/{ns}/{name}/{container}?{query}"),
            )
            .await?;
        let stream = resp
            .into_body()
            .into_data_stream()
            .map(|chunk| chunk.map_err(std::io::Error::other));
        Ok(ApiResponse::Stream {
            content_type: "text/plain",
            body: Box::pin(stream),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_container_is_named_or_the_only_one() {
        let one = json!({"spec": {"containers": [{"name": "main"}]}});
        assert_eq!(container_of(&one, "p", None).expect("only"), "main");
        assert_eq!(
            container_of(&one, "p", Some("main")).expect("named"),
            "main"
        );
        let e = container_of(&one, "p", Some("side")).expect_err("unknown");
        assert!(e.message.contains("container side is not valid for pod p"));
        let two = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}],
            "initContainers": [{"name": "init"}]}});
        let e = container_of(&two, "p", None).expect_err("ambiguous");
        assert_eq!(e.code, 400);
        assert!(e.message.contains("choose one of: [a b]"), "{}", e.message);
        assert_eq!(container_of(&two, "p", Some("init")).expect("init"), "init");
    }
}
