//! Shared by the local cluster's test files.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use serde_json::json;

/// A namespace of the test's own, `NAME-PID`.
pub async fn namespace(client: &kube::Client, name: &str) -> String {
    let ns = format!("{name}-{}", std::process::id());
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace"),
        )
        .await
        .expect("create namespace");
    ns
}
