//! The rules both request paths decide by: a revision's timeout and upstream protocol, who
//! may start its pods, and the bounds on the API reads the decision makes. Pure.

use std::time::Duration;

use crds::{ActivatorMember, Revision};

use crate::upstream::proxy::UpstreamProtocol;
use crate::wire::answer::Refusal;
use crate::wire::naming::RevisionKey;

/// How long a request waits for a new revision's subset to be published before a 503.
pub(crate) const SUBSET_WAIT: Duration = Duration::from_secs(10);

/// Upper bound on one API read on the request path (the client has no read timeout of its own).
pub(crate) const API_READ_LIMIT: Duration = Duration::from_secs(10);

/// The schema's maximum `timeoutSeconds`.
const MAX_TIMEOUT_SECONDS: i64 = 3600;

/// Whether member `m` may create pods of `rev`: with maxScale set, only with a share of it.
pub(crate) fn can_start(rev: &Revision, m: &ActivatorMember) -> bool {
    rev.spec.max_scale == 0 || m.max_pods > 0
}

/// The revision's request timeout, clamped as the schema does in case it got past it.
pub(crate) fn request_timeout(rev: &Revision) -> Duration {
    Duration::from_secs(
        rev.spec
            .timeout_seconds
            .clamp(1, MAX_TIMEOUT_SECONDS)
            .unsigned_abs(),
    )
}

/// 504: the revision's `timeoutSeconds` passed before its answer began.
pub(crate) fn too_late(key: &RevisionKey, timeout: Duration) -> Refusal {
    Refusal::timeout(format!(
        "revision {key}: no answer within its timeout of {}s",
        timeout.as_secs()
    ))
}

/// HTTP/2 to the app (and between activators, so trailers survive the hop) when the
/// revision's first container port is named `h2c`, as Knative decides. Read once per cached
/// copy of the revision (`PodTemplate::first_port_name`): parsing the template per request
/// would cost more than the proxying.
pub(crate) fn upstream_protocol(rev: &Revision) -> UpstreamProtocol {
    UpstreamProtocol::for_port_name(rev.spec.template.first_port_name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_named_h2c_selects_http2_upstream() {
        let rev = |port: &str| -> Revision {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "local-activator.dev/v1alpha1",
                "kind": "Revision",
                "metadata": {"name": "r", "namespace": "n"},
                "spec": {"template": {"spec": {"containers": [{
                    "name": "app", "ports": [{"containerPort": 8080, "name": port}],
                }]}}},
            }))
            .unwrap()
        };
        assert_eq!(upstream_protocol(&rev("h2c")), UpstreamProtocol::H2c);
        assert_eq!(upstream_protocol(&rev("http")), UpstreamProtocol::Http1);
    }
}
