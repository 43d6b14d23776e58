//! The membership stream's server side (`crds::member_stream`): every replica, leader or
//! standby, streams each activator its node's memberships from the ActivationEndpoints it
//! watches anyway, so no activator watches them on the API server. It reads the objects
//! only, never the policy: a replica serves streams for subsets any subsetter wrote
//! (docs/member-stream.md).

pub mod hub;
pub mod serve;

pub use hub::MemberHub;
pub use serve::{StreamAccess, SyncSource};
