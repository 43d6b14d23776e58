//! Test helpers: a fake backend, and an agent served on a socket in a fresh temporary folder.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::BackendError;
use crate::image::{Credentials, ImageId, ImageInfo, ImageRef};
use crate::protocol::{PodUid, PullFailure};
use crate::server::{Backend, BackendFuture, ImageFuture, PullFuture, ServerConfig, serve};

/// The fake holds this image from the start.
pub(crate) const IMG_PRESENT: &str = "registry.test/app:v1";
/// Pulls of this one succeed.
pub(crate) const IMG_PULLABLE: &str = "registry.test/app:v2";
/// The registry has no such image.
pub(crate) const IMG_MISSING: &str = "registry.test/missing:v1";
/// Pulls need the credentials robot:pw.
pub(crate) const IMG_PRIVATE: &str = "registry.test/private/app:v1";
/// Pulls of this one wait until the test opens [`FakeBackend::slow_gate`].
pub(crate) const IMG_SLOW: &str = "registry.test/slow:v1";

pub(crate) const UID_A: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
pub(crate) const UID_B: &str = "11111111-2222-4333-8444-555555555555";
/// The fake backend fails for this one, with a reason that needs sanitising.
pub(crate) const UID_ERR: &str = "eeeeeeee-eeee-4eee-8eee-eeeeeeeeeeee";
/// The fake backend answers this one after a delay.
pub(crate) const UID_SLOW: &str = "5105105a-5105-4105-8105-5105105a5105";

/// A folder of its own under the system's temporary folder (no tempfile crate): the test
/// process id and a counter keep concurrent tests and runs apart.
pub(crate) fn temp_dir() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "node-agent-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a temporary folder");
    dir
}

/// This process's effective uid, without libc: the owner of a folder it just created.
pub(crate) fn current_uid() -> u32 {
    let dir = temp_dir();
    let uid = std::fs::metadata(&dir).expect("stat").uid();
    let _ = std::fs::remove_dir_all(&dir);
    uid
}

pub(crate) struct FakeBackend {
    addrs: HashMap<String, IpAddr>,
    hang: bool,
    pub(crate) calls: AtomicUsize,
    /// Each pull asked for: the image and the username of its credentials.
    pub(crate) pulls: Mutex<Vec<(String, Option<String>)>>,
    /// Images held: those pulled join the one held from the start.
    images: Mutex<HashMap<String, ImageInfo>>,
    /// Slow pulls wait for a permit here.
    pub(crate) slow_gate: tokio::sync::Semaphore,
}

impl FakeBackend {
    pub(crate) fn standard() -> FakeBackend {
        FakeBackend {
            addrs: HashMap::from([
                (UID_A.to_owned(), "10.244.0.7".parse().unwrap()),
                (UID_B.to_owned(), "fd00::17".parse().unwrap()),
                (UID_SLOW.to_owned(), "10.244.0.99".parse().unwrap()),
            ]),
            hang: false,
            calls: AtomicUsize::new(0),
            pulls: Mutex::new(Vec::new()),
            images: Mutex::new(HashMap::from([(
                IMG_PRESENT.to_owned(),
                ImageInfo {
                    id: ImageId::new("sha256:aaaa").unwrap(),
                    size: 1234,
                },
            )])),
            slow_gate: tokio::sync::Semaphore::new(0),
        }
    }

    pub(crate) fn hanging() -> FakeBackend {
        FakeBackend {
            hang: true,
            ..FakeBackend::standard()
        }
    }
}

impl Backend for FakeBackend {
    fn pod_addr<'a>(&'a self, uid: &'a PodUid) -> BackendFuture<'a> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.hang {
                std::future::pending::<()>().await;
            }
            match uid.as_str() {
                UID_ERR => Err(BackendError::new("cri said: no\n")),
                UID_SLOW => {
                    // A slow lookup, to show answers keep the order of their requests.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok(self.addrs.get(UID_SLOW).copied())
                }
                other => Ok(self.addrs.get(other).copied()),
            }
        })
    }

    fn image_status<'a>(&'a self, image: &'a ImageRef) -> ImageFuture<'a> {
        Box::pin(async move { Ok(self.images.lock().unwrap().get(image.as_str()).cloned()) })
    }

    fn pull_image<'a>(
        &'a self,
        image: &'a ImageRef,
        auth: Option<&'a Credentials>,
    ) -> PullFuture<'a> {
        Box::pin(async move {
            self.pulls.lock().unwrap().push((
                image.as_str().to_owned(),
                auth.map(|a| a.username().to_owned()),
            ));
            match image.as_str() {
                IMG_MISSING => return Err(BackendError::new(PullFailure::NOT_FOUND)),
                IMG_PRIVATE
                    if auth.map(|a| (a.username(), a.password())) != Some(("robot", "pw")) =>
                {
                    return Err(BackendError::new(PullFailure::UNAUTHORIZED));
                }
                IMG_SLOW => {
                    let permit = self.slow_gate.acquire().await.expect("gate closed");
                    permit.forget();
                }
                _ => {}
            }
            let id = ImageId::new(&format!("sha256:{}", image.as_str().len())).unwrap();
            let info = ImageInfo {
                id: id.clone(),
                size: 1000 + image.as_str().len() as u64,
            };
            self.images
                .lock()
                .unwrap()
                .insert(image.as_str().to_owned(), info);
            Ok(id)
        })
    }
}

/// An agent serving a fake backend on a socket in a temporary folder.
pub(crate) struct Server {
    pub(crate) dir: PathBuf,
    pub(crate) path: PathBuf,
    pub(crate) backend: Arc<FakeBackend>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Server {
    pub(crate) async fn start(cfg: ServerConfig) -> Server {
        Server::start_with(cfg, FakeBackend::standard()).await
    }

    pub(crate) async fn start_with(cfg: ServerConfig, backend: FakeBackend) -> Server {
        let dir = temp_dir();
        let path = dir.join("agent.sock");
        Server::start_at(dir, path, cfg, Arc::new(backend))
    }

    /// Serves at `path` (which must not exist), e.g. again after [`Server::stop_keeping`].
    pub(crate) fn start_at(
        dir: PathBuf,
        path: PathBuf,
        cfg: ServerConfig,
        backend: Arc<FakeBackend>,
    ) -> Server {
        let listener = UnixListener::bind(&path).expect("bind");
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(listener, backend.clone(), cfg, stop.clone()));
        Server {
            dir,
            path,
            backend,
            stop,
            task,
        }
    }

    pub(crate) async fn connect(&self) -> UnixStream {
        UnixStream::connect(&self.path).await.expect("connect")
    }

    /// Stops serving (closing every connection) and removes the socket, keeping the folder.
    pub(crate) async fn stop_keeping(self) -> (PathBuf, PathBuf, Arc<FakeBackend>) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("serve did not return after stop")
            .expect("serve panicked");
        let _ = std::fs::remove_file(&self.path);
        (self.dir, self.path, self.backend)
    }

    pub(crate) async fn stop(self) {
        let (dir, _, _) = self.stop_keeping().await;
        let _ = std::fs::remove_dir_all(dir);
    }
}
