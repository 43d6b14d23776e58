//! The CRI backend against a fake runtime: k8s-cri's generated server, served by tonic over a
//! unix socket in a temporary folder.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use k8s_cri::v1::image_service_server::{ImageService, ImageServiceServer};
use k8s_cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use k8s_cri::v1::*;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::*;
use crate::client::AgentClient;
use crate::server::{ServerConfig, serve};
use crate::testutil::{UID_A, UID_B, UID_ERR, UID_SLOW, temp_dir};

/// A pod whose sandbox has no address yet.
const UID_NO_IP: &str = "00000000-0000-4000-8000-000000000001";
/// The fake gives this one's sandbox an address that is not one.
const UID_BAD_IP: &str = "00000000-0000-4000-8000-000000000002";

/// A sloppy runtime: it records each request and then ignores the filter, returning every
/// sandbox it has, so the test also shows the agent checks UID and state itself.
#[derive(Default)]
struct FakeCri {
    sandboxes: Vec<PodSandbox>,
    ips: HashMap<String, String>,
    lists: Mutex<Vec<ListPodSandboxRequest>>,
    statuses: Mutex<Vec<String>>,
    /// Images held, by the reference they were pulled by: (id, size).
    images: Mutex<HashMap<String, (String, u64)>>,
    pulls: Mutex<Vec<PullImageRequest>>,
}

const IMG_HELD: &str = "registry.test/app:v1";
const IMG_OK: &str = "registry.test/app:v2";
const IMG_MISSING: &str = "registry.test/missing:v1";
const IMG_PRIVATE: &str = "registry.test/private/app:v1";
const IMG_SLOW: &str = "registry.test/slow:v1";
const IMG_REFUSED: &str = "registry.test/refused:v1";
const IMG_BROKEN: &str = "registry.test/broken:v1";

/// An image service answering as containerd does: registry failures as `Unknown` with the
/// registry's words in the message.
#[tonic::async_trait]
impl ImageService for FakeCri {
    async fn list_images(
        &self,
        _: Request<ListImagesRequest>,
    ) -> Result<Response<ListImagesResponse>, Status> {
        Err(Status::unimplemented("list_images"))
    }

    async fn image_status(
        &self,
        request: Request<ImageStatusRequest>,
    ) -> Result<Response<ImageStatusResponse>, Status> {
        let name = request
            .into_inner()
            .image
            .map(|i| i.image)
            .unwrap_or_default();
        let image = self
            .images
            .lock()
            .unwrap()
            .get(&name)
            .map(|(id, size)| Image {
                id: id.clone(),
                size: *size,
                repo_tags: vec![name.clone()],
                ..Default::default()
            });
        Ok(Response::new(ImageStatusResponse {
            image,
            ..Default::default()
        }))
    }

    async fn pull_image(
        &self,
        request: Request<PullImageRequest>,
    ) -> Result<Response<PullImageResponse>, Status> {
        let request = request.into_inner();
        self.pulls.lock().unwrap().push(request.clone());
        let name = request.image.map(|i| i.image).unwrap_or_default();
        let auth = request.auth.map(|a| (a.username, a.password));
        match name.as_str() {
            IMG_MISSING => {
                return Err(Status::unknown(format!(
                    "failed to pull and unpack image \"{name}\": failed to resolve reference \"{name}\": {name}: not found"
                )));
            }
            IMG_PRIVATE if auth != Some(("robot".into(), "pw".into())) => {
                return Err(Status::unknown(format!(
                    "failed to pull and unpack image \"{name}\": failed to resolve reference \"{name}\": unexpected status from HEAD request: 401 Unauthorized"
                )));
            }
            IMG_SLOW => std::future::pending::<()>().await,
            IMG_REFUSED => return Err(Status::invalid_argument("invalid reference")),
            IMG_BROKEN => return Err(Status::internal("no space left on device\nsecret path")),
            _ => {}
        }
        let id = format!("sha256:{:064x}", name.len());
        self.images
            .lock()
            .unwrap()
            .insert(name, (id.clone(), 4_000_000));
        Ok(Response::new(PullImageResponse { image_ref: id }))
    }

    async fn remove_image(
        &self,
        _: Request<RemoveImageRequest>,
    ) -> Result<Response<RemoveImageResponse>, Status> {
        Err(Status::unimplemented("remove_image"))
    }

    async fn image_fs_info(
        &self,
        _: Request<ImageFsInfoRequest>,
    ) -> Result<Response<ImageFsInfoResponse>, Status> {
        Err(Status::unimplemented("image_fs_info"))
    }
}

fn sandbox(id: &str, uid: &str, ready: bool, created_at: i64) -> PodSandbox {
    PodSandbox {
        id: id.into(),
        metadata: Some(PodSandboxMetadata {
            name: format!("pod-{id}"),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        state: if ready {
            PodSandboxState::SandboxReady as i32
        } else {
            PodSandboxState::SandboxNotready as i32
        },
        created_at,
        labels: [(POD_UID_LABEL.to_owned(), uid.to_owned())].into(),
        ..Default::default()
    }
}

impl FakeCri {
    fn standard() -> FakeCri {
        FakeCri {
            sandboxes: vec![
                sandbox("a-old", UID_A, true, 100),
                sandbox("a-new", UID_A, true, 200),
                // Newer still, but not ready: never chosen.
                sandbox("a-dead", UID_A, false, 300),
                // Another pod's newest sandbox.
                sandbox("b", UID_B, true, 400),
                sandbox("no-ip", UID_NO_IP, true, 100),
                sandbox("bad-ip", UID_BAD_IP, true, 100),
                sandbox("err", UID_ERR, true, 100),
                sandbox("slow", UID_SLOW, true, 100),
            ],
            ips: [
                ("a-old", "10.244.0.1"),
                ("a-new", "10.244.0.2"),
                ("a-dead", "10.244.0.3"),
                ("b", "fd00::b"),
                ("no-ip", ""),
                ("bad-ip", "10.244.0.256"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
            images: Mutex::new(HashMap::from([(
                IMG_HELD.to_owned(),
                ("sha256:held".to_owned(), 1234),
            )])),
            ..Default::default()
        }
    }
}

macro_rules! fake_runtime {
    ($($name:ident($req:ty) -> $resp:ty;)*) => {
        #[tonic::async_trait]
        impl RuntimeService for FakeCri {
            async fn version(
                &self,
                _: Request<VersionRequest>,
            ) -> Result<Response<VersionResponse>, Status> {
                Ok(Response::new(VersionResponse {
                    version: "0.1.0".into(),
                    runtime_name: "fakecri".into(),
                    runtime_version: "1.2.3".into(),
                    runtime_api_version: "v1".into(),
                }))
            }

            async fn list_pod_sandbox(
                &self,
                request: Request<ListPodSandboxRequest>,
            ) -> Result<Response<ListPodSandboxResponse>, Status> {
                let request = request.into_inner();
                let uid = request
                    .filter
                    .as_ref()
                    .and_then(|f| f.label_selector.get(POD_UID_LABEL).cloned())
                    .unwrap_or_default();
                self.lists.lock().unwrap().push(request);
                match uid.as_str() {
                    UID_ERR => return Err(Status::internal("disk on fire\nsecret details")),
                    UID_SLOW => std::future::pending::<()>().await,
                    _ => {}
                }
                Ok(Response::new(ListPodSandboxResponse {
                    items: self.sandboxes.clone(),
                }))
            }

            async fn pod_sandbox_status(
                &self,
                request: Request<PodSandboxStatusRequest>,
            ) -> Result<Response<PodSandboxStatusResponse>, Status> {
                let id = request.into_inner().pod_sandbox_id;
                self.statuses.lock().unwrap().push(id.clone());
                let ip = self
                    .ips
                    .get(&id)
                    .ok_or_else(|| Status::not_found("no such sandbox"))?;
                Ok(Response::new(PodSandboxStatusResponse {
                    status: Some(PodSandboxStatus {
                        id,
                        network: Some(PodSandboxNetworkStatus {
                            ip: ip.clone(),
                            additional_ips: vec![],
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }))
            }

            type GetContainerEventsStream =
                tokio_stream::Empty<Result<ContainerEventResponse, Status>>;

            async fn get_container_events(
                &self,
                _: Request<GetEventsRequest>,
            ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
                Err(Status::unimplemented("get_container_events"))
            }

            $(
                async fn $name(&self, _: Request<$req>) -> Result<Response<$resp>, Status> {
                    Err(Status::unimplemented(stringify!($name)))
                }
            )*
        }
    };
}

fake_runtime! {
    run_pod_sandbox(RunPodSandboxRequest) -> RunPodSandboxResponse;
    stop_pod_sandbox(StopPodSandboxRequest) -> StopPodSandboxResponse;
    remove_pod_sandbox(RemovePodSandboxRequest) -> RemovePodSandboxResponse;
    create_container(CreateContainerRequest) -> CreateContainerResponse;
    start_container(StartContainerRequest) -> StartContainerResponse;
    stop_container(StopContainerRequest) -> StopContainerResponse;
    remove_container(RemoveContainerRequest) -> RemoveContainerResponse;
    list_containers(ListContainersRequest) -> ListContainersResponse;
    container_status(ContainerStatusRequest) -> ContainerStatusResponse;
    update_container_resources(UpdateContainerResourcesRequest) -> UpdateContainerResourcesResponse;
    reopen_container_log(ReopenContainerLogRequest) -> ReopenContainerLogResponse;
    exec_sync(ExecSyncRequest) -> ExecSyncResponse;
    exec(ExecRequest) -> ExecResponse;
    attach(AttachRequest) -> AttachResponse;
    port_forward(PortForwardRequest) -> PortForwardResponse;
    container_stats(ContainerStatsRequest) -> ContainerStatsResponse;
    list_container_stats(ListContainerStatsRequest) -> ListContainerStatsResponse;
    pod_sandbox_stats(PodSandboxStatsRequest) -> PodSandboxStatsResponse;
    list_pod_sandbox_stats(ListPodSandboxStatsRequest) -> ListPodSandboxStatsResponse;
    update_runtime_config(UpdateRuntimeConfigRequest) -> UpdateRuntimeConfigResponse;
    status(StatusRequest) -> StatusResponse;
    checkpoint_container(CheckpointContainerRequest) -> CheckpointContainerResponse;
    list_metric_descriptors(ListMetricDescriptorsRequest) -> ListMetricDescriptorsResponse;
    list_pod_sandbox_metrics(ListPodSandboxMetricsRequest) -> ListPodSandboxMetricsResponse;
    runtime_config(RuntimeConfigRequest) -> RuntimeConfigResponse;
}

struct Runtime {
    dir: PathBuf,
    path: PathBuf,
    fake: Arc<FakeCri>,
    stop: CancellationToken,
}

impl Runtime {
    fn start() -> Runtime {
        let dir = temp_dir();
        let path = dir.join("cri.sock");
        Runtime::start_at(dir, path)
    }

    fn start_at(dir: PathBuf, path: PathBuf) -> Runtime {
        let fake = Arc::new(FakeCri::standard());
        let listener = UnixListener::bind(&path).unwrap();
        let stop = CancellationToken::new();
        let server = tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::from_arc(fake.clone()))
            .add_service(ImageServiceServer::from_arc(fake.clone()))
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(listener),
                stop.clone().cancelled_owned(),
            );
        tokio::spawn(server);
        Runtime {
            dir,
            path,
            fake,
            stop,
        }
    }

    fn endpoint(&self) -> String {
        format!("unix://{}", self.path.display())
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn uid(s: &str) -> PodUid {
    PodUid::new(s).unwrap()
}

#[tokio::test]
async fn finds_the_newest_ready_sandbox_of_the_pod_with_the_right_filter() {
    let rt = Runtime::start();
    let cri = CriBackend::connect(&rt.endpoint()).unwrap();
    assert_eq!(
        cri.pod_addr(&uid(UID_A)).await.unwrap(),
        Some("10.244.0.2".parse().unwrap())
    );
    let lists = rt.fake.lists.lock().unwrap().clone();
    assert_eq!(lists.len(), 1);
    let filter = lists[0].filter.clone().expect("a filter");
    assert_eq!(
        filter.label_selector,
        HashMap::from([(POD_UID_LABEL.to_owned(), UID_A.to_owned())])
    );
    assert_eq!(
        filter.state,
        Some(PodSandboxStateValue {
            state: PodSandboxState::SandboxReady as i32
        })
    );
    assert_eq!(filter.id, "");
    assert_eq!(*rt.fake.statuses.lock().unwrap(), ["a-new"]);

    assert_eq!(
        cri.pod_addr(&uid(UID_B)).await.unwrap(),
        Some("fd00::b".parse().unwrap())
    );
}

#[tokio::test]
async fn no_sandbox_or_no_address_is_none() {
    let rt = Runtime::start();
    let cri = CriBackend::connect(&rt.endpoint()).unwrap();
    assert_eq!(cri.pod_addr(&uid(UID_NO_IP)).await.unwrap(), None);
    let absent = uid("12345678-1234-4234-8234-123456789abc");
    assert_eq!(cri.pod_addr(&absent).await.unwrap(), None);
}

#[tokio::test]
async fn runtime_failures_become_short_reasons() {
    let rt = Runtime::start();
    let cri = CriBackend::connect_with_timeout(&rt.endpoint(), Duration::from_millis(300)).unwrap();
    assert_eq!(
        cri.pod_addr(&uid(UID_BAD_IP)).await,
        Err(BackendError::new("runtime gave a bad address"))
    );
    // The runtime's message stays in the agent's log.
    assert_eq!(
        cri.pod_addr(&uid(UID_ERR)).await,
        Err(BackendError::new("runtime error Internal"))
    );
    let err = cri.pod_addr(&uid(UID_SLOW)).await.unwrap_err();
    assert_eq!(err, BackendError::new("runtime timeout"));
}

#[tokio::test]
async fn an_absent_runtime_is_unreachable_and_found_once_it_starts() {
    let dir = temp_dir();
    let path = dir.join("cri.sock");
    let cri = CriBackend::connect(&format!("unix://{}", path.display())).unwrap();
    assert_eq!(
        cri.pod_addr(&uid(UID_A)).await,
        Err(BackendError::new("runtime unreachable"))
    );
    assert_eq!(
        cri.version().await,
        Err(BackendError::new("runtime unreachable"))
    );
    // The same backend reconnects once the runtime is there.
    let rt = Runtime::start_at(dir, path);
    assert_eq!(
        cri.pod_addr(&uid(UID_A)).await.unwrap(),
        Some("10.244.0.2".parse().unwrap())
    );
    drop(rt);
}

#[tokio::test]
async fn version_names_the_runtime() {
    let rt = Runtime::start();
    // A plain path works as well as unix://.
    let cri = CriBackend::connect(rt.path.to_str().unwrap()).unwrap();
    assert_eq!(
        cri.version().await.unwrap(),
        RuntimeVersion {
            runtime_name: "fakecri".into(),
            runtime_version: "1.2.3".into(),
            runtime_api_version: "v1".into(),
        }
    );
}

#[test]
fn only_unix_socket_endpoints_are_accepted() {
    for bad in [
        "tcp://127.0.0.1:1234",
        "http://localhost",
        "relative/path",
        "unix://relative",
        "",
    ] {
        assert!(CriBackend::connect(bad).is_err(), "{bad}");
    }
    assert_eq!(
        socket_path("unix:///run/containerd/containerd.sock").unwrap(),
        PathBuf::from("/run/containerd/containerd.sock")
    );
}

#[tokio::test]
async fn end_to_end_client_agent_runtime() {
    let rt = Runtime::start();
    let cri = CriBackend::connect(&rt.endpoint()).unwrap();
    let dir = temp_dir();
    let sock = dir.join("agent.sock");
    let stop = CancellationToken::new();
    let agent = tokio::spawn(serve(
        UnixListener::bind(&sock).unwrap(),
        Arc::new(cri),
        ServerConfig::default(),
        stop.clone(),
    ));
    let client = AgentClient::new(&sock);
    assert_eq!(
        client.pod_addr(&uid(UID_A)).await.unwrap(),
        Some("10.244.0.2".parse().unwrap())
    );
    match client.pod_addr(&uid(UID_ERR)).await {
        Err(crate::error::ClientError::Agent(reason)) => {
            assert_eq!(reason, "runtime error Internal")
        }
        other => panic!("{other:?}"),
    }
    stop.cancel();
    agent.await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

fn image(s: &str) -> ImageRef {
    ImageRef::new(s).unwrap()
}

#[tokio::test]
async fn image_status_and_pulls_through_the_image_service() {
    let rt = Runtime::start();
    let cri = CriBackend::connect_with_timeouts(
        &rt.endpoint(),
        Duration::from_secs(1),
        Duration::from_millis(300),
    )
    .unwrap();
    assert_eq!(
        cri.image_status(&image(IMG_HELD)).await.unwrap(),
        Some(ImageInfo {
            id: ImageId::new("sha256:held").unwrap(),
            size: 1234
        })
    );
    assert_eq!(cri.image_status(&image(IMG_OK)).await.unwrap(), None);
    let id = cri.pull_image(&image(IMG_OK), None).await.unwrap();
    assert!(id.as_str().starts_with("sha256:"));
    assert_eq!(
        cri.image_status(&image(IMG_OK))
            .await
            .unwrap()
            .map(|i| i.size),
        Some(4_000_000)
    );
    let fail = |img: &'static str, auth: Option<Credentials>| {
        let cri = cri.clone();
        async move {
            cri.pull_image(&image(img), auth.as_ref())
                .await
                .unwrap_err()
                .reason
        }
    };
    assert_eq!(fail(IMG_MISSING, None).await, "not found");
    assert_eq!(fail(IMG_PRIVATE, None).await, "unauthorized");
    assert_eq!(
        fail(
            IMG_PRIVATE,
            Some(Credentials::new("robot", "nope").unwrap())
        )
        .await,
        "unauthorized"
    );
    assert_eq!(fail(IMG_REFUSED, None).await, "bad name");
    // The runtime's message stays in the agent's log.
    assert_eq!(fail(IMG_BROKEN, None).await, "runtime error Internal");
    assert_eq!(fail(IMG_SLOW, None).await, "runtime timeout");
    let auth = Credentials::new("robot", "pw").unwrap();
    cri.pull_image(&image(IMG_PRIVATE), Some(&auth))
        .await
        .unwrap();
    // The request the runtime got: the reference as given, the credentials as fields.
    let pulls = rt.fake.pulls.lock().unwrap().clone();
    let last = pulls.last().unwrap();
    assert_eq!(last.image.as_ref().unwrap().image, IMG_PRIVATE);
    let a = last.auth.as_ref().unwrap();
    assert_eq!((a.username.as_str(), a.password.as_str()), ("robot", "pw"));
    assert_eq!(pulls.len(), 8);
}

#[tokio::test]
async fn an_absent_runtime_fails_pulls_as_unreachable() {
    let dir = temp_dir();
    let cri = CriBackend::connect(&format!("unix://{}", dir.join("cri.sock").display())).unwrap();
    assert_eq!(
        cri.pull_image(&image(IMG_OK), None)
            .await
            .unwrap_err()
            .reason,
        "runtime unreachable"
    );
    assert_eq!(
        cri.image_status(&image(IMG_OK)).await.unwrap_err().reason,
        "runtime unreachable"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn runtime_messages_are_classified() {
    let cases = [
        // containerd 1.7 / 2.x
        (
            "failed to pull and unpack image \"docker.io/library/nope:latest\": failed to resolve reference \"docker.io/library/nope:latest\": docker.io/library/nope:latest: not found",
            Some("not found"),
        ),
        (
            "failed to pull and unpack image \"ghcr.io/o/p:v1\": failed to resolve reference \"ghcr.io/o/p:v1\": failed to authorize: failed to fetch anonymous token: unexpected status from GET request to https://ghcr.io/token?scope=repository%3Ao%2Fp%3Apull&service=ghcr.io: 401 Unauthorized",
            Some("unauthorized"),
        ),
        (
            "failed to pull and unpack image \"docker.io/library/x:1\": failed to resolve reference: pull access denied, repository does not exist or may require authorization: server message: insufficient_scope: authorization failed",
            Some("unauthorized"),
        ),
        (
            "failed to pull and unpack image \"r.io/a:1\": failed to copy: httpReadSeeker: failed open: unexpected status code https://r.io/v2/a/manifests/sha256:00: 404 Not Found",
            Some("not found"),
        ),
        // CRI-O
        (
            "reading manifest latest in quay.io/o/nope: manifest unknown",
            Some("not found"),
        ),
        (
            "reading manifest v1 in quay.io/o/private: unauthorized: access to the requested resource is not authorized",
            Some("unauthorized"),
        ),
        ("invalid reference format", Some("bad name")),
        (
            "failed to pull and unpack image \"r.io/a:1\": failed to do request: Head \"https://r.io/v2/a/manifests/1\": dial tcp 10.0.0.1:443: i/o timeout",
            None,
        ),
        ("no space left on device", None),
    ];
    for (message, want) in cases {
        assert_eq!(classify_pull_message(message), want, "{message}");
    }
}

#[tokio::test]
async fn end_to_end_pull_client_agent_runtime() {
    let rt = Runtime::start();
    let cri = CriBackend::connect(&rt.endpoint()).unwrap();
    let dir = temp_dir();
    let sock = dir.join("agent.sock");
    let stop = CancellationToken::new();
    let agent = tokio::spawn(serve(
        UnixListener::bind(&sock).unwrap(),
        Arc::new(cri),
        ServerConfig::default(),
        stop.clone(),
    ));
    let client = AgentClient::new(&sock).with_timeout(Duration::from_secs(10));
    assert_eq!(client.image_status(&image(IMG_OK)).await.unwrap(), None);
    let auth = Credentials::new("robot", "pw").unwrap();
    client.pull(&image(IMG_OK), None).await.unwrap();
    client.pull(&image(IMG_PRIVATE), Some(&auth)).await.unwrap();
    assert_eq!(
        client
            .image_status(&image(IMG_OK))
            .await
            .unwrap()
            .map(|i| i.size),
        Some(4_000_000)
    );
    match client.pull(&image(IMG_MISSING), None).await {
        Err(crate::error::ClientError::Agent(reason)) => assert_eq!(reason, "not found"),
        other => panic!("{other:?}"),
    }
    stop.cancel();
    agent.await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
