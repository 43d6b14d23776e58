//! How long losses of activators wait before their subsets are repaired: the settle times the
//! activator watch (`cluster::usable_activators`) applies, and the outage hold's default.

/// How long a lost activator waits before its subsets are repaired: long enough for a mass
/// NotReady (the controller-manager marks every stale node, then their pods, in one pass) to
/// show itself, short beside the node-monitor grace period (40 s) a node failure already
/// takes to be seen.
pub const LOSS_SETTLE: std::time::Duration = std::time::Duration::from_secs(3);

/// How long after its watches failed for want of the API server the subsetter takes a Node
/// NotReady for the outage's aftermath (`Config::outage_hold`): the node-monitor grace
/// period (40 s) after the lease a kubelet renewed last before the outage, plus its renewal
/// interval (10 s) and a margin; a node that really failed meanwhile is repaired this much
/// later.
pub const OUTAGE_HOLD: std::time::Duration = std::time::Duration::from_secs(60);

/// How long held activators wait after a disruption ends before what is still gone is
/// repaired: the kubelets' status sync (10 s) clears the controller-manager's unready marks.
pub const RECOVERY_SETTLE: std::time::Duration = std::time::Duration::from_secs(15);
