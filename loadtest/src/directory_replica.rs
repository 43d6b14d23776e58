//! A directory replica beside the harness's subsetter, as `subsetter --directory-only` runs
//! one: its own ActivationEndpoints watch and caches, its own port, never leading. With two,
//! a scenario can kill one under load and watch the activators streaming from it resume on
//! the other (docs/member-stream.md).

use std::net::SocketAddr;
use std::sync::Arc;

use crate::Error;

/// One replica, serving until [`DirectoryReplica::kill`] or drop.
pub struct DirectoryReplica {
    pub addr: SocketAddr,
    caches: Arc<subsetter::Caches>,
    task: tokio::task::JoinHandle<()>,
}

impl DirectoryReplica {
    /// Starts `sub`'s caches afresh and serves them on `ip` (any port).
    pub async fn start(sub: &subsetter::Subsetter, ip: std::net::IpAddr) -> Result<Self, Error> {
        let caches = Arc::new(sub.start_caches());
        let (addr, task) = subsetter::directory::serve(SocketAddr::new(ip, 0), Arc::clone(&caches))
            .await
            .map_err(|e| Error::Options(format!("binding a directory replica: {e}")))?;
        Ok(Self { addr, caches, task })
    }

    /// The member labels of the nodes streaming from this replica now.
    pub fn streaming(&self) -> Vec<String> {
        self.caches.hub.labels()
    }

    /// Gone as a killed pod is: its port closed, every stream ended, its watch stopped.
    pub fn kill(self) {
        drop(self);
    }
}

impl Drop for DirectoryReplica {
    fn drop(&mut self) {
        self.task.abort();
        self.caches.hub.close_all();
        self.caches.stop();
    }
}
