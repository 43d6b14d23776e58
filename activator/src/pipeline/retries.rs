//! A pod that refused the connection never saw the request, so the request takes another slot
//! as it is, body and all — at most `Core::pod_retries` times (`crate::pipeline::core`). Both transports count and bound
//! it here.

use crate::node::pool::Lease;
use crate::ops::metrics::Metrics;

pub(crate) struct PodRetries<'a> {
    left: u32,
    metrics: &'a Metrics,
}

impl<'a> PodRetries<'a> {
    pub(crate) fn new(left: u32, metrics: &'a Metrics) -> Self {
        Self { left, metrics }
    }

    /// `lease`'s pod refused the connection: it is reported (the scaler probes it and takes it
    /// out), and the answer is whether the request may be admitted again (counted in
    /// `activator_retries_total`); false when it has had its retries and fails.
    pub(crate) fn after_refused(&mut self, lease: Lease) -> bool {
        lease.unreachable();
        if self.left == 0 {
            return false;
        }
        self.metrics.retries.inc();
        self.left -= 1;
        true
    }
}
