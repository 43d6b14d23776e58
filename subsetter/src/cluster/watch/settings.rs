//! The settings ConfigMap's watch (`--settings-config-map`): its keys over the flags while it
//! exists and parses (`settings.rs` parses; this applies).

use std::sync::Arc;

use crds::backoff::resilient;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::watcher::{self, Event};
use tracing::{info, warn};

use crate::cluster::context::Context;
use crate::pure::settings::{self, Settings};

/// Keeps the settings in force in step with the ConfigMap `name`: its keys over `base` (the
/// flags) while it exists and parses, `base` once it is gone. A ConfigMap that does not parse
/// is refused whole, with its reasons logged, and the settings in force stay.
pub(crate) async fn watch_settings(
    api: Api<ConfigMap>,
    name: String,
    base: Settings,
    ctx: Arc<Context>,
) {
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(resilient(watcher::watcher(api, cfg)));
    let mut listed = false;
    while let Some(ev) = events.next().await {
        let cm = match ev {
            Ok(Event::Init) => {
                listed = false;
                continue;
            }
            Ok(Event::InitDone) => {
                if !listed {
                    ctx.apply(&base);
                    ctx.metrics.settings_reverted.inc();
                }
                continue;
            }
            Ok(Event::Delete(_)) => {
                info!(configmap = %name, "settings ConfigMap deleted; the flags are in force");
                ctx.apply(&base);
                ctx.metrics.settings_reverted.inc();
                continue;
            }
            Ok(Event::Apply(cm) | Event::InitApply(cm)) => cm,
            Err(e) => {
                warn!(configmap = %name, error = %e, "settings watch; retrying");
                continue;
            }
        };
        listed = true;
        match settings::parse(&cm.data.unwrap_or_default(), &base) {
            Ok(s) => {
                info!(configmap = %name, ?s, "settings in force");
                ctx.apply(&s);
                ctx.metrics.settings_applied.inc();
            }
            Err(reasons) => {
                warn!(configmap = %name, ?reasons, "settings ConfigMap refused; keeping the settings in force");
                ctx.metrics.settings_refused.inc();
            }
        }
    }
}
