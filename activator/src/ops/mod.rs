//! Operating the activator: the admin port (health, readiness, metrics), the metrics
//! themselves, the API requests counted, Kubernetes Events, and tracing/OpenTelemetry.

pub mod admin;
pub mod api_count;
pub mod events;
pub mod metrics;
pub mod telemetry;
