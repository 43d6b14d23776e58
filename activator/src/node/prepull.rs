//! Members pull ahead: when this node becomes a member of a revision's subset (or the
//! revision's images change), the node agent has the runtime pull the revision's images
//! before any request for it, so its cold starts here skip the pull (on real clusters the
//! largest part of a cold start).
//!
//! One background task on the control runtime (the caller of [`crate::Activator::start`],
//! never a serving thread) owns a [`PullQueue`]: one entry per image, whatever the number of
//! revisions naming it; at most `concurrency` pulls at once, each on the agent client of its
//! own (so a pull never holds a connection a cold start's `addr` question waits for); a
//! transient failure retried after a jittered back-off; a final one (bad name, not found,
//! unauthorized) told to each revision naming the image as an `ImagePullFailed` Event, and
//! not retried until the image or its credentials change. Nothing here is on the request path.
//!
//! Without a node agent there is no pre-pull (the task is never started); with an agent that
//! does not pull (kubesim's simulated nodes answer `error unsupported`) the task stops at its
//! first answer.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crds::{ObjectKey as RevisionKey, Revision};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::Api;
use node_agent::{AgentClient, ClientError, Credentials, ImageRef, PullFailure};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cache::revisions::{RevisionCache, SubsetOf};
use crate::node::prepull_images::{Wanted, opted_out, wanted};
use crate::node::prepull_queue::{Job, Outcome, PullQueue, RetryPolicy};
use crate::node::pull_secrets::Keyring;
use crate::ops::events::EventSink;
use crate::ops::metrics::{Metrics, PullFailReason};

/// The reason an agent without image support gives (kubesim's nodes).
const UNSUPPORTED: &str = "unsupported";

/// How the pre-pull runs.
#[derive(Debug, Clone)]
pub struct PrepullConfig {
    /// Pulls in flight at once on this node (the agent has its own bound, `--max-pulls`).
    pub concurrency: usize,
    /// Whether revisions' image pull secrets (and their service accounts') are read to pull
    /// private images. Off: revisions naming pull secrets are not pre-pulled.
    pub secrets: bool,
    pub retry: RetryPolicy,
    /// The bound on one exchange with the agent about a pull: above the agent's own pull
    /// timeout (10 min by default), so the agent's answer, not this, ends a slow pull.
    pub exchange_timeout: Duration,
}

impl Default for PrepullConfig {
    fn default() -> Self {
        Self {
            concurrency: 2,
            secrets: false,
            retry: RetryPolicy::default(),
            exchange_timeout: Duration::from_secs(15 * 60),
        }
    }
}

enum Command {
    Member { key: RevisionKey, of: SubsetOf },
    Left(RevisionKey),
}

/// The handle the membership watch feeds. Cheap to clone; sending never blocks.
#[derive(Clone)]
pub struct Prepull {
    tx: mpsc::UnboundedSender<Command>,
}

/// What the pre-pull's task is given.
pub struct PrepullDeps {
    pub agent_socket: std::path::PathBuf,
    pub node: String,
    pub cfg: PrepullConfig,
    pub client: kube::Client,
    pub revisions: RevisionCache,
    pub events: EventSink,
    pub metrics: Arc<Metrics>,
}

impl Prepull {
    /// Starts the task (on the current runtime) until `stop`.
    pub fn start(deps: PrepullDeps, stop: CancellationToken) -> Prepull {
        let (tx, rx) = mpsc::unbounded_channel();
        let runner = Runner::new(deps);
        tokio::spawn(runner.run(rx, stop));
        Prepull { tx }
    }

    /// This node is (still) a member of `key`'s subset, written for the Revision `of` names.
    pub fn member(&self, key: RevisionKey, of: SubsetOf) {
        let _ = self.tx.send(Command::Member { key, of });
    }

    /// This node is no longer a member of `key`'s subset.
    pub fn left(&self, key: RevisionKey) {
        let _ = self.tx.send(Command::Left(key));
    }
}

/// A revision read for its images, tagged with the membership it was read for.
type Read = (RevisionKey, u64, Option<Arc<Revision>>);

/// One pull's end: the image, what happened, and the metric reason of a failure.
enum Ran {
    Done(ImageRef, Outcome, Option<PullFailReason>),
    /// The agent does not pull images.
    Unsupported,
}

struct Runner {
    agent: AgentClient,
    node: String,
    cfg: PrepullConfig,
    client: kube::Client,
    revisions: RevisionCache,
    events: EventSink,
    metrics: Arc<Metrics>,
    queue: PullQueue<RevisionKey>,
    /// Member revisions, by the membership epoch their read was asked at (a read that comes
    /// back after its revision left, or was asked again, is dropped), and the revision once
    /// read (the `regarding` of its events).
    members: HashMap<RevisionKey, (u64, Option<Arc<Revision>>)>,
    epoch: u64,
    /// Revisions already told (logged, counted, an Event) of a skip or a bad name: once per
    /// membership.
    told: HashSet<(RevisionKey, String)>,
}

impl Runner {
    fn new(d: PrepullDeps) -> Self {
        let agent = AgentClient::new(&d.agent_socket).with_timeout(d.cfg.exchange_timeout);
        Self {
            agent,
            node: d.node,
            queue: PullQueue::new(d.cfg.retry.clone()),
            cfg: d.cfg,
            client: d.client,
            revisions: d.revisions,
            events: d.events,
            metrics: d.metrics,
            members: HashMap::new(),
            epoch: 0,
            told: HashSet::new(),
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>, stop: CancellationToken) {
        let mut pulls: JoinSet<Ran> = JoinSet::new();
        let mut reads: JoinSet<Read> = JoinSet::new();
        loop {
            while pulls.len() < self.cfg.concurrency.max(1) {
                let Some(job) = self.queue.next(Instant::now()) else {
                    break;
                };
                pulls.spawn(pull_one(self.agent.clone(), job, self.metrics.clone()));
            }
            self.gauges(pulls.len());
            let wake = self.queue.next_wake();
            tokio::select! {
                _ = stop.cancelled() => return,
                cmd = rx.recv() => match cmd {
                    Some(Command::Member { key, of }) => {
                        self.epoch += 1;
                        let epoch = self.epoch;
                        let held = self.members.get(&key).and_then(|(_, r)| r.clone());
                        self.members.insert(key.clone(), (epoch, held));
                        let revisions = self.revisions.clone();
                        reads.spawn(async move {
                            match revisions.get_member(&key, &of).await {
                                Ok(rev) => (key, epoch, rev),
                                Err(error) => {
                                    tracing::debug!(revision = %key, %error, "reading a member revision for its images");
                                    (key, epoch, None)
                                }
                            }
                        });
                    }
                    Some(Command::Left(key)) => {
                        self.members.remove(&key);
                        self.told.retain(|(k, _)| *k != key);
                        self.queue.remove_revision(&key);
                    }
                    None => return,
                },
                Some(read) = reads.join_next(), if !reads.is_empty() => {
                    if let Ok((key, epoch, rev)) = read {
                        self.revision_read(key, epoch, rev).await;
                    }
                }
                Some(ran) = pulls.join_next(), if !pulls.is_empty() => match ran {
                    Ok(Ran::Done(image, outcome, reason)) => self.finished(&image, &outcome, reason),
                    Ok(Ran::Unsupported) => {
                        tracing::info!("the node agent does not pull images: no pre-pull on this node");
                        self.gauges(0);
                        return;
                    }
                    Err(error) => tracing::warn!(%error, "a pre-pull task failed"),
                },
                _ = sleep_until(wake), if wake.is_some() => {}
            }
        }
    }

    fn gauges(&self, in_flight: usize) {
        let m = &self.metrics.prepull;
        m.queue_depth
            .set(i64::try_from(self.queue.depth()).unwrap_or(i64::MAX));
        m.in_flight
            .set(i64::try_from(in_flight).unwrap_or(i64::MAX));
    }

    /// A member revision was read: queue its images.
    async fn revision_read(&mut self, key: RevisionKey, epoch: u64, rev: Option<Arc<Revision>>) {
        match self.members.get(&key) {
            Some((e, _)) if *e == epoch => {}
            // Left, or asked again since: that read decides.
            _ => return,
        }
        let Some(rev) = rev else {
            return;
        };
        self.members.insert(key.clone(), (epoch, Some(rev.clone())));
        if opted_out(&rev) {
            tracing::debug!(revision = %key, "pre-pull turned off by the revision's annotation");
            self.queue.remove_revision(&key);
            return;
        }
        let template = match rev.spec.template.parse() {
            Ok(t) => t,
            Err(error) => {
                tracing::debug!(revision = %key, %error, "a revision's template is not a pod template: nothing to pre-pull");
                self.queue.remove_revision(&key);
                return;
            }
        };
        let w = wanted(&template);
        for name in &w.invalid {
            if self.told.insert((key.clone(), format!("invalid {name}"))) {
                self.metrics.prepull.failed(PullFailReason::BadName);
                self.events
                    .image_pull_failed(&rev, &self.node, name, PullFailure::BAD_NAME);
            }
        }
        let images = match self.credentials(&key, &w).await {
            Ok(images) => images,
            Err(reason) => {
                if self.told.insert((key.clone(), "skipped".into())) {
                    self.metrics.prepull.failed(reason);
                    tracing::info!(revision = %key, ?reason, "not pre-pulling this revision's images; the kubelet pulls them at its first start");
                }
                self.queue.remove_revision(&key);
                return;
            }
        };
        let known = self.queue.set_revision(key, images);
        for (image, failure) in known {
            self.tell(&rev, image.as_str(), &failure);
        }
    }

    /// Each image with the credentials the kubelet would use for it.
    async fn credentials(
        &self,
        key: &RevisionKey,
        w: &Wanted,
    ) -> Result<Vec<(ImageRef, Option<Credentials>)>, PullFailReason> {
        if !self.cfg.secrets {
            if !w.pull_secrets.is_empty() {
                return Err(PullFailReason::NeedsPullSecret);
            }
            return Ok(w.images.iter().map(|i| (i.clone(), None)).collect());
        }
        let keyring = self.keyring(&key.namespace, w).await?;
        Ok(w.images
            .iter()
            .map(|i| (i.clone(), keyring.lookup(i).cloned()))
            .collect())
    }

    /// The keyring of the template's pull secrets and its service account's, in that order
    /// (the kubelet's). A Secret or service account that does not exist is skipped, as the
    /// kubelet does; one that cannot be read fails the revision's pre-pull.
    async fn keyring(&self, namespace: &str, w: &Wanted) -> Result<Keyring, PullFailReason> {
        let mut names = w.pull_secrets.clone();
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        match accounts.get_opt(&w.service_account).await {
            Ok(Some(sa)) => names.extend(
                sa.image_pull_secrets
                    .into_iter()
                    .flatten()
                    .map(|r| r.name)
                    .filter(|n| !n.is_empty()),
            ),
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(namespace, service_account = %w.service_account, %error, "reading a service account for its image pull secrets");
                return Err(PullFailReason::BadPullSecret);
            }
        }
        let mut seen = HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let mut keyring = Keyring::default();
        for name in names {
            match secrets.get_opt(&name).await {
                Ok(Some(secret)) => {
                    let data = secret
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0))
                        .collect();
                    let type_ = secret.type_.unwrap_or_default();
                    if let Err(error) = keyring.add_secret(&type_, &data) {
                        tracing::warn!(namespace, secret = %name, %error, "an image pull secret gives no credentials");
                    }
                }
                Ok(None) => {
                    tracing::debug!(namespace, secret = %name, "an image pull secret does not exist")
                }
                Err(error) => {
                    tracing::warn!(namespace, secret = %name, %error, "reading an image pull secret");
                    return Err(PullFailReason::BadPullSecret);
                }
            }
        }
        Ok(keyring)
    }

    fn finished(&mut self, image: &ImageRef, outcome: &Outcome, reason: Option<PullFailReason>) {
        let m = &self.metrics.prepull;
        match (outcome, reason) {
            (Outcome::Present, _) => {
                m.present.inc();
            }
            (Outcome::Pulled, _) => {
                m.succeeded.inc();
            }
            (Outcome::Failed(_), r) => m.failed(r.unwrap_or(PullFailReason::Other)),
        }
        let revisions = self
            .queue
            .finished(image, outcome, Instant::now(), rand::random::<f64>());
        let Outcome::Failed(failure) = outcome else {
            return;
        };
        if failure.is_transient() {
            tracing::debug!(%image, reason = %failure.reason(), "pre-pull failed; retrying later");
            return;
        }
        tracing::info!(%image, reason = %failure.reason(), revisions = revisions.len(), "pre-pull failed");
        for key in revisions {
            if let Some((_, Some(rev))) = self.members.get(&key) {
                let rev = rev.clone();
                self.tell(&rev, image.as_str(), failure);
            }
        }
    }

    /// An `ImagePullFailed` Event on `rev` (the sink limits it to one per revision, image and
    /// reason per minute, and its rate).
    fn tell(&self, rev: &Revision, image: &str, failure: &PullFailure) {
        let mut why = failure.reason();
        if *failure == PullFailure::Unauthorized && !self.cfg.secrets {
            why.push_str(
                " (pulled without credentials: --prepull-secrets is off; the kubelet uses the \
                 pod's pull secrets at its first start)",
            );
        }
        self.events.image_pull_failed(rev, &self.node, image, &why);
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One image: skipped if the runtime holds it, else pulled (and its size read back).
async fn pull_one(agent: AgentClient, job: Job, metrics: Arc<Metrics>) -> Ran {
    let m = &metrics.prepull;
    match agent.image_status(&job.image).await {
        Ok(Some(_)) => return Ran::Done(job.image, Outcome::Present, None),
        Ok(None) => {}
        Err(ClientError::Agent(reason)) if reason == UNSUPPORTED => return Ran::Unsupported,
        // The pull below would fail the same way, and say why.
        Err(error) => {
            tracing::debug!(image = %job.image, %error, "asking the node agent for an image")
        }
    }
    m.started.inc();
    let started = Instant::now();
    let result = agent.pull(&job.image, job.auth.as_ref()).await;
    m.duration.observe(started.elapsed().as_secs_f64());
    match result {
        Ok(id) => {
            tracing::info!(image = %job.image, %id, took = ?started.elapsed(), "pre-pulled");
            if let Ok(Some(info)) = agent.image_status(&job.image).await {
                m.bytes.inc_by(info.size);
            }
            Ran::Done(job.image, Outcome::Pulled, None)
        }
        Err(ClientError::Agent(reason)) if reason == UNSUPPORTED => Ran::Unsupported,
        Err(error) => {
            let (failure, reason) = classify(&error);
            Ran::Done(job.image, Outcome::Failed(failure), Some(reason))
        }
    }
}

/// A failed exchange as a pull failure (transient unless the agent named a final reason),
/// and its metric label.
fn classify(error: &ClientError) -> (PullFailure, PullFailReason) {
    let ClientError::Agent(reason) = error else {
        return (
            PullFailure::Other("agent unreachable".into()),
            PullFailReason::AgentUnreachable,
        );
    };
    let failure = PullFailure::from_reason(reason);
    let label = match &failure {
        PullFailure::BadName => PullFailReason::BadName,
        PullFailure::NotFound => PullFailReason::NotFound,
        PullFailure::Unauthorized => PullFailReason::Unauthorized,
        PullFailure::RuntimeTimeout => PullFailReason::RuntimeTimeout,
        PullFailure::RuntimeUnreachable => PullFailReason::RuntimeUnreachable,
        PullFailure::Busy => PullFailReason::Busy,
        PullFailure::Runtime(_) => PullFailReason::RuntimeError,
        PullFailure::Other(_) => PullFailReason::Other,
    };
    (failure, label)
}

/// Whether a pre-pull can run with this configuration: only with a node agent.
pub fn enabled(enabled: bool, agent_socket: Option<&Path>) -> bool {
    enabled && agent_socket.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_agent_means_no_pre_pull() {
        assert!(!enabled(true, None));
        assert!(!enabled(false, Some(Path::new("/run/a.sock"))));
        assert!(enabled(true, Some(Path::new("/run/a.sock"))));
    }

    #[test]
    fn exchange_failures_are_transient_and_agent_reasons_are_kept() {
        let (f, r) = classify(&ClientError::Timeout);
        assert!(f.is_transient());
        assert_eq!(r, PullFailReason::AgentUnreachable);
        let (f, r) = classify(&ClientError::Agent("not found".into()));
        assert_eq!((f, r), (PullFailure::NotFound, PullFailReason::NotFound));
        let (f, r) = classify(&ClientError::Agent("runtime error Internal".into()));
        assert!(f.is_transient());
        assert_eq!(r, PullFailReason::RuntimeError);
    }
}
