//! The revisions of this node's subsets are read ahead of their first request (a member's
//! cold start then makes one API request, the pod create; paced after a start: `read_ahead`).
//! Those with a share of minScale here also get a pool (and so their pods) without waiting
//! for a request; the pool keeps them while the share lasts. With a node agent, their images
//! are pulled ahead too (`prepull`), once their Revision is held.

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use crate::cache::endpoints::MemberEvent;
use crate::cache::revisions::RevisionCache;
use crate::node::pool;
use crate::node::pools::Pools;
use crate::node::prepull::Prepull;
use crate::node::read_ahead::{ReadAhead, ReadAheadConfig};

/// Follows this node's memberships (`member_of`, from the subset watch) until `stop`.
pub(crate) async fn keep_members_warm(
    mut member_of: UnboundedReceiver<MemberEvent>,
    pools: Pools,
    revisions: RevisionCache,
    prepull: Option<Prepull>,
    read_ahead: ReadAheadConfig,
    queued: prometheus_client::metrics::gauge::Gauge,
    stop: CancellationToken,
) {
    let mut ahead = ReadAhead::new(revisions.clone(), read_ahead, prepull, Some(queued));
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            _ = ahead.step() => continue,
            m = member_of.recv() => match m { Some(m) => m, None => return },
        };
        let (key, me) = match event {
            MemberEvent::Left(key) => {
                ahead.left(key);
                continue;
            }
            MemberEvent::Member {
                key,
                me,
                of,
                listed,
            } => {
                ahead.member(key.clone(), of, listed);
                if me.min_pods == 0 {
                    continue;
                }
                (key, me)
            }
        };
        match revisions.get_or_fetch(&key).await {
            Ok(Some(rev)) => {
                let me = std::sync::Arc::new(me);
                let spec = pool::Spec {
                    rev: rev.clone(),
                    me: me.clone(),
                };
                pools.get(&key, &rev, &me).set_spec(&spec);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(revision = %key, error = %e, "reading a revision to keep its minScale share")
            }
        }
    }
}
