//! The production backend: the node's container runtime over CRI v1 (containerd, CRI-O).
//!
//! Two read-only calls answer `addr`: `ListPodSandbox` (filtered by the pod UID label the
//! kubelet puts on every sandbox) and `PodSandboxStatus`; `image` is answered by the image
//! service's `ImageStatus`, and `pull` by its `PullImage` (the one call that changes the
//! node: it adds an image, as the kubelet would at the pod's start). `Version` is called once
//! at start for the log. The socket grants far more (creating and killing containers, exec),
//! which is why it stays in this container and the activator gets only the line protocol.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    AuthConfig, ImageSpec, ImageStatusRequest, ListPodSandboxRequest, PodSandboxFilter,
    PodSandboxState, PodSandboxStateValue, PodSandboxStatusRequest, PullImageRequest,
    VersionRequest,
};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::BackendError;
use crate::image::{Credentials, ImageId, ImageInfo, ImageRef};
use crate::protocol::{PodUid, PullFailure};
use crate::server::{Backend, BackendFuture, ImageFuture, PullFuture};

/// The label the kubelet sets on each sandbox to the pod's UID.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

/// The default bound on one CRI call: the runtime answers these from memory in milliseconds,
/// and the activator asks again soon anyway.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// The default bound on one image pull.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(600);

/// What the runtime says it is, from its `Version` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeVersion {
    pub runtime_name: String,
    pub runtime_version: String,
    pub runtime_api_version: String,
}

#[derive(Clone)]
pub struct CriBackend {
    client: RuntimeServiceClient<Channel>,
    /// On a channel of its own, whose per-request timeout is the pull timeout: the runtime
    /// channel's is the short call timeout.
    images: ImageServiceClient<Channel>,
    timeout: Duration,
    pull_timeout: Duration,
}

impl CriBackend {
    /// A backend for the runtime at `endpoint`: `unix:///run/containerd/containerd.sock` or a
    /// plain absolute path. Does not connect: the channel connects on first use and again after
    /// a failure, so an agent started before the runtime (or across a runtime restart) serves
    /// as soon as the runtime does.
    pub fn connect(endpoint: &str) -> Result<CriBackend, BackendError> {
        CriBackend::connect_with_timeout(endpoint, CALL_TIMEOUT)
    }

    pub fn connect_with_timeout(
        endpoint: &str,
        timeout: Duration,
    ) -> Result<CriBackend, BackendError> {
        CriBackend::connect_with_timeouts(endpoint, timeout, PULL_TIMEOUT)
    }

    /// As [`CriBackend::connect`], with a bound on each call and another on each pull.
    pub fn connect_with_timeouts(
        endpoint: &str,
        timeout: Duration,
        pull_timeout: Duration,
    ) -> Result<CriBackend, BackendError> {
        let path = socket_path(endpoint)?;
        Ok(CriBackend {
            client: RuntimeServiceClient::new(channel(path.clone(), timeout, timeout)),
            images: ImageServiceClient::new(channel(path, timeout, pull_timeout)),
            timeout,
            pull_timeout,
        })
    }

    /// The runtime's name and versions.
    pub async fn version(&self) -> Result<RuntimeVersion, BackendError> {
        let mut client = self.client.clone();
        let call = client.version(VersionRequest {
            version: String::new(),
        });
        let v = self.bounded("Version", call).await?;
        Ok(RuntimeVersion {
            runtime_name: v.runtime_name,
            runtime_version: v.runtime_version,
            runtime_api_version: v.runtime_api_version,
        })
    }

    async fn lookup(&self, uid: &PodUid) -> Result<Option<IpAddr>, BackendError> {
        let mut client = self.client.clone();
        let filter = PodSandboxFilter {
            id: String::new(),
            state: Some(PodSandboxStateValue {
                state: PodSandboxState::SandboxReady as i32,
            }),
            label_selector: [(POD_UID_LABEL.to_owned(), uid.as_str().to_owned())].into(),
        };
        let list = self
            .bounded(
                "ListPodSandbox",
                client.list_pod_sandbox(ListPodSandboxRequest {
                    filter: Some(filter),
                }),
            )
            .await?;
        // The runtime filters, but checking again costs nothing: an answer for another pod
        // would send the activator's traffic to the wrong place.
        let newest = list
            .items
            .into_iter()
            .filter(|s| {
                s.state == PodSandboxState::SandboxReady as i32
                    && s.labels.get(POD_UID_LABEL).map(String::as_str) == Some(uid.as_str())
            })
            .max_by_key(|s| s.created_at);
        let Some(sandbox) = newest else {
            return Ok(None);
        };
        let status = self
            .bounded(
                "PodSandboxStatus",
                client.pod_sandbox_status(PodSandboxStatusRequest {
                    pod_sandbox_id: sandbox.id.clone(),
                    verbose: false,
                }),
            )
            .await?;
        let ip = status
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default();
        if ip.is_empty() {
            // No address yet (or a host-network sandbox, which has none of its own).
            return Ok(None);
        }
        ip.parse().map(Some).map_err(|_| {
            tracing::warn!(sandbox = %sandbox.id, ip = %ip.escape_debug(), "the runtime gave an unparsable sandbox address");
            BackendError::new("runtime gave a bad address")
        })
    }

    async fn image(&self, image: &ImageRef) -> Result<Option<ImageInfo>, BackendError> {
        let mut images = self.images.clone();
        let call = images.image_status(ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        });
        let Some(found) = self.bounded("ImageStatus", call).await?.image else {
            return Ok(None);
        };
        let id = ImageId::new(&found.id).map_err(|_| {
            tracing::warn!(%image, id = %found.id.escape_debug(), "the runtime gave an unusable image id");
            BackendError::new("runtime gave a bad image id")
        })?;
        Ok(Some(ImageInfo {
            id,
            size: found.size,
        }))
    }

    async fn pull(
        &self,
        image: &ImageRef,
        auth: Option<&Credentials>,
    ) -> Result<ImageId, BackendError> {
        let mut images = self.images.clone();
        let call = images.pull_image(PullImageRequest {
            image: Some(image_spec(image)),
            auth: auth.map(|a| AuthConfig {
                username: a.username().to_owned(),
                password: a.password().to_owned(),
                ..Default::default()
            }),
            // As `crictl pull`: no sandbox yet (the pod does not exist); runtimes use it only
            // for a runtime handler's own pull rules.
            sandbox_config: None,
        });
        let image_ref = match tokio::time::timeout(self.pull_timeout, call).await {
            Ok(Ok(response)) => response.into_inner().image_ref,
            Ok(Err(status)) => return Err(pull_error(&status)),
            Err(_) => {
                tracing::warn!(%image, timeout = ?self.pull_timeout, "PullImage timed out");
                return Err(BackendError::new(PullFailure::RUNTIME_TIMEOUT));
            }
        };
        ImageId::new(&image_ref).map_err(|_| {
            tracing::warn!(%image, image_ref = %image_ref.escape_debug(), "the runtime gave an unusable image ref");
            BackendError::new("runtime gave a bad image id")
        })
    }

    /// One CRI call, bounded by the timeout, its failure reduced to a short reason (the full
    /// status goes to the log, not to the activator).
    async fn bounded<T>(
        &self,
        call: &'static str,
        fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, BackendError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(status_error(call, &status)),
            Err(_) => {
                tracing::warn!(call, timeout = ?self.timeout, "CRI call timed out");
                Err(BackendError::new("runtime timeout"))
            }
        }
    }
}

/// A lazily connected channel to the runtime's unix socket.
fn channel(path: PathBuf, connect_timeout: Duration, timeout: Duration) -> Channel {
    // The URI is only a placeholder gRPC needs for its :authority; the connector below
    // ignores it and dials the unix socket.
    Endpoint::from_static("http://cri.invalid")
        .connect_timeout(connect_timeout)
        .timeout(timeout)
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
}

fn image_spec(image: &ImageRef) -> ImageSpec {
    ImageSpec {
        image: image.as_str().to_owned(),
        user_specified_image: image.as_str().to_owned(),
        ..Default::default()
    }
}

/// A failed `PullImage`, as one of the protocol's pull failure reasons. containerd and CRI-O
/// report most registry failures as `Unknown` with the registry's words in the message, so
/// the message is read when the code says nothing.
fn pull_error(status: &tonic::Status) -> BackendError {
    use tonic::Code;
    tracing::warn!(code = ?status.code(), message = %status.message(), "PullImage failed");
    let reason = match status.code() {
        Code::NotFound => PullFailure::NOT_FOUND.to_owned(),
        Code::Unauthenticated | Code::PermissionDenied => PullFailure::UNAUTHORIZED.to_owned(),
        Code::InvalidArgument => PullFailure::BAD_NAME.to_owned(),
        _ => match classify_pull_message(status.message()) {
            Some(reason) => reason.to_owned(),
            None => return status_error("PullImage", status),
        },
    };
    BackendError::new(reason)
}

/// The pull failure a runtime's message names, if it names one. The phrases are those of
/// containerd 1.7/2.x and CRI-O 1.28+ (docs/node-agent.md lists examples); authorization is
/// checked first, since Docker Hub answers a private or missing repository alike with
/// "pull access denied ... may require authorization".
pub(crate) fn classify_pull_message(message: &str) -> Option<&'static str> {
    let m = message.to_ascii_lowercase();
    let any = |phrases: &[&str]| phrases.iter().any(|p| m.contains(p));
    if any(&[
        "401 unauthorized",
        "403 forbidden",
        "unauthorized",
        "authentication required",
        "authorization failed",
        "access denied",
        "access to the resource is denied",
        "insufficient_scope",
    ]) {
        Some(PullFailure::UNAUTHORIZED)
    } else if any(&[
        ": not found",
        "404 not found",
        "manifest unknown",
        "name unknown",
        "repository does not exist",
    ]) {
        Some(PullFailure::NOT_FOUND)
    } else if any(&[
        "invalid reference format",
        "failed to parse image reference",
        "parsing image name",
    ]) {
        Some(PullFailure::BAD_NAME)
    } else {
        None
    }
}

fn status_error(call: &'static str, status: &tonic::Status) -> BackendError {
    use tonic::Code;
    tracing::warn!(call, code = ?status.code(), message = %status.message(), "CRI call failed");
    match status.code() {
        Code::Unavailable => BackendError::new("runtime unreachable"),
        // A channel that cannot reach the socket may report its transport error as Unknown.
        Code::Unknown if is_transport(status) => BackendError::new("runtime unreachable"),
        Code::DeadlineExceeded | Code::Cancelled => BackendError::new("runtime timeout"),
        code => BackendError::new(format!("runtime error {code:?}")),
    }
}

/// Whether the status came from the channel (no connection) rather than from the runtime.
fn is_transport(status: &tonic::Status) -> bool {
    std::error::Error::source(status)
        .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some())
}

/// The socket path of a CRI endpoint: `unix://` + an absolute path, or the path alone. Any
/// other scheme is refused: a node's runtime listens on a unix socket, and the agent must not
/// be pointed at the network.
fn socket_path(endpoint: &str) -> Result<PathBuf, BackendError> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if path.starts_with('/') {
        Ok(PathBuf::from(path))
    } else {
        Err(BackendError::new(format!(
            "CRI endpoint {endpoint:?}: want unix:///absolute/path or /absolute/path"
        )))
    }
}

impl Backend for CriBackend {
    fn pod_addr<'a>(&'a self, uid: &'a PodUid) -> BackendFuture<'a> {
        Box::pin(self.lookup(uid))
    }

    fn image_status<'a>(&'a self, image: &'a ImageRef) -> ImageFuture<'a> {
        Box::pin(self.image(image))
    }

    fn pull_image<'a>(
        &'a self,
        image: &'a ImageRef,
        auth: Option<&'a Credentials>,
    ) -> PullFuture<'a> {
        Box::pin(self.pull(image, auth))
    }
}

#[cfg(test)]
mod tests;
