//! The node's pods of each revision: the pool a request takes a slot from and its throttle,
//! the pools by revision (`pools`, which pairs each pool with its scaler), the scaler task
//! that owns the pods (how many: `pod_count`; creating and deleting them:
//! `pod_writer`, with the pod built by `pod_spec`), readiness probes, the pod's address from
//! the node agent (`node_addr`), adopting pods a previous process left, and the timing marks
//! of a cold start.

pub(crate) mod adopt;
pub mod cold_start;
pub(crate) mod node_addr;
pub(crate) mod pod_count;
pub(crate) mod pod_spec;
pub(crate) mod pod_writer;
pub(crate) mod pool;
pub(crate) mod pools;
pub mod prepull;
pub(crate) mod prepull_images;
pub(crate) mod prepull_queue;
pub(crate) mod pull_secrets;
pub mod read_ahead;
pub(crate) mod readiness;
pub(crate) mod scaler;
pub(crate) mod throttle;
pub(crate) mod warm;
