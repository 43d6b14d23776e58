//! Small helpers for talking to the API server the way a kubelet does: retry transient
//! failures a few times, treat "the object is gone" as an answer rather than an error.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::Value;

pub const FIELD_MANAGER: &str = "kubesim-kubelet";
const ATTEMPTS: u32 = 5;

/// The HTTP code of an API error answer, `None` for transport errors.
pub fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

pub fn is_code(e: &kube::Error, code: u16) -> bool {
    api_code(e) == Some(code)
}

/// Worth retrying: transport failures, 429, 5xx, and 409 Conflict.
fn transient(e: &kube::Error) -> bool {
    match api_code(e) {
        None => true,
        Some(code) => code == 409 || code == 429 || code >= 500,
    }
}

async fn backoff(attempt: u32) {
    tokio::time::sleep(Duration::from_millis(50 << attempt.min(5))).await;
}

/// Merge-patches `pods/<name>/status`. `Ok(false)` when the pod no longer exists.
pub async fn patch_pod_status(
    api: &Api<Pod>,
    name: &str,
    patch: &Value,
) -> Result<bool, kube::Error> {
    let params = PatchParams::default();
    let mut attempt = 0;
    loop {
        match api.patch_status(name, &params, &Patch::Merge(patch)).await {
            Ok(_) => return Ok(true),
            Err(e) if is_code(&e, 404) => return Ok(false),
            Err(e) if transient(&e) && attempt + 1 < ATTEMPTS => {
                attempt += 1;
                backoff(attempt).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Removes a pod whose containers are gone, as the kubelet's status manager does: grace
/// period 0, guarded by the uid so a newer pod of the same name is never touched.
pub async fn delete_pod_now(api: &Api<Pod>, name: &str, uid: &str) -> Result<(), kube::Error> {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let mut attempt = 0;
    loop {
        match api.delete(name, &params).await {
            Ok(_) => return Ok(()),
            // Gone already, or a different pod now has this name (uid precondition failed).
            Err(e) if is_code(&e, 404) || is_code(&e, 409) => return Ok(()),
            Err(e) if transient(&e) && attempt + 1 < ATTEMPTS => {
                attempt += 1;
                backoff(attempt).await;
            }
            Err(e) => return Err(e),
        }
    }
}
