//! Logs and OpenTelemetry traces.
//!
//! [`init`] installs the process's `tracing` subscriber: a fmt layer (filtered by `RUST_LOG`,
//! default `info`) and, when an OTLP endpoint is configured, a `tracing-opentelemetry` layer
//! exporting spans over OTLP/gRPC. Everything about the export is configured by the standard
//! `OTEL_*` variables (see docs/observability.md).
//!
//! [`inject_traceparent`] and [`extract_parent`] / [`set_parent_from_headers`] carry the W3C
//! trace context across the activator: from the incoming request to the request's span, and
//! from the current span to the request sent to a pod or a peer activator.
//!
//! With no exporter they cost a header lookup and never make a `traceparent` up: the current
//! span has no OpenTelemetry context, so [`inject_traceparent`] leaves the headers as they are
//! and a `traceparent` the client sent passes through to the app unchanged (as Knative's
//! activator does when tracing is off). With an exporter, every request's span is part of
//! the trace: the app sees the activator's span as its parent, with the sampling decision of
//! the configured sampler (by default, the caller's).

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names one.
pub const DEFAULT_SERVICE_NAME: &str = "local-activator";
/// The instrumentation scope of the activator's spans.
const SCOPE: &str = "local-activator";
/// W3C trace context headers.
const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// Targets whose spans are never exported: the exporter's own transport (exporting its spans
/// would feed the exporter with itself) and the HTTP plumbing under every request.
const NOT_EXPORTED: &[&str] = &[
    "h2",
    "hyper",
    "hyper_util",
    "tonic",
    "tower",
    "opentelemetry",
    "opentelemetry_sdk",
    "opentelemetry_otlp",
];

/// Why the subscriber could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("installing the tracing subscriber: {0}")]
    Install(#[from] tracing_subscriber::util::TryInitError),
}

/// What the process knows about itself, added to the OpenTelemetry resource as `k8s.*` and
/// `service.instance.id` attributes; `OTEL_RESOURCE_ATTRIBUTES` overrides them.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    pub node_name: Option<String>,
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
}

/// The installed telemetry. Call [`Telemetry::shutdown`] before exiting, so the spans still
/// buffered are exported.
#[derive(Debug)]
#[must_use = "shut the telemetry down on exit, or buffered spans are lost"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported (an OTLP endpoint is configured and the exporter was built).
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Flushes and stops the exporter, waiting at most `timeout`: a collector that is slow or
    /// unreachable costs the spans it did not take, never a hung exit. The flush runs on its
    /// own thread (the SDK's shutdown blocks), so neither the runtime's workers nor its drop
    /// wait for it.
    pub async fn shutdown(self, timeout: Duration) {
        let Some(provider) = self.provider else {
            return;
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("otel-shutdown".into())
            .spawn(move || {
                let _ = tx.send(provider.shutdown_with_timeout(timeout));
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "trace exporter: could not start its shutdown");
            return;
        }
        // The SDK bounds its own wait by `timeout`; this bound is for the thread's start.
        match tokio::time::timeout(timeout + Duration::from_millis(200), rx).await {
            Ok(Ok(Ok(()))) => tracing::debug!("trace exporter flushed"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "trace exporter: spans lost at shutdown"),
            Ok(Err(_)) | Err(_) => {
                tracing::warn!(?timeout, "trace exporter: shutdown timed out, spans lost")
            }
        }
    }
}

/// Whether requests get spans (one per request and per stage). On only while spans are
/// exported: a span costs the warm path about a microsecond even when nobody reads it.
static REQUEST_SPANS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the request path should make spans (see [`init`]).
pub fn request_spans() -> bool {
    REQUEST_SPANS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Turns request spans on or off (tests that install their own exporting subscriber).
pub fn set_request_spans(on: bool) {
    REQUEST_SPANS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Installs the global `tracing` subscriber: logs to stderr filtered by `RUST_LOG` (default
/// `info`), and spans to an OTLP/gRPC collector when [`otlp_configured`].
///
/// Must run inside a Tokio runtime (the gRPC channel is created on it). An exporter that
/// cannot be built (an invalid endpoint, an `https` endpoint: this build has no TLS for
/// OTLP) is logged as an error and the process runs without traces: a telemetry typo must
/// not stop a node's data plane. Fails only if a global subscriber is already installed.
pub fn init(identity: &Identity) -> Result<Telemetry, TelemetryError> {
    let provider = if otlp_configured(|k| std::env::var(k).ok()) {
        match build_provider(identity) {
            Ok(p) => Some(p),
            Err(e) => {
                // Logged once the subscriber is installed, below.
                install(None)?;
                tracing::error!(error = %e, "OTLP trace exporter not built: running without traces");
                return Ok(Telemetry { provider: None });
            }
        }
    } else {
        None
    };
    install(provider.as_ref())?;
    REQUEST_SPANS.store(provider.is_some(), std::sync::atomic::Ordering::Relaxed);
    if provider.is_some() {
        for var in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Ok(p) = std::env::var(var)
                && p != "grpc"
            {
                tracing::warn!(%var, protocol = %p, "only OTLP over gRPC is built in: exporting over gRPC");
            }
        }
        tracing::info!("exporting traces over OTLP/gRPC");
    }
    Ok(Telemetry { provider })
}

fn install(provider: Option<&SdkTracerProvider>) -> Result<(), TelemetryError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let otel = provider.map(|p| otel_layer(p.tracer(SCOPE)));
    tracing_subscriber::registry()
        .with(filter)
        // Colour only on a terminal: a pod's log is a file, where escapes are noise.
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout())),
        )
        .with(otel)
        .try_init()?;
    Ok(())
}

/// The OpenTelemetry layer for `tracer`, without the spans of [`NOT_EXPORTED`] targets.
fn otel_layer<S, T>(tracer: T) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    T: opentelemetry::trace::Tracer + 'static,
    T::Span: Send + Sync,
{
    let targets = NOT_EXPORTED.iter().fold(
        Targets::new().with_default(LevelFilter::TRACE),
        |t, target| t.with_target(*target, LevelFilter::OFF),
    );
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(targets)
}

/// Whether spans are to be exported: an OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), the SDK is not disabled (`OTEL_SDK_DISABLED=true`)
/// and `OTEL_TRACES_EXPORTER` is not `none`. `env` looks a variable up.
pub fn otlp_configured(env: impl Fn(&str) -> Option<String>) -> bool {
    let set = |k: &str| env(k).is_some_and(|v| !v.trim().is_empty());
    let is = |k: &str, want: &str| env(k).is_some_and(|v| v.trim().eq_ignore_ascii_case(want));
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        && !is("OTEL_SDK_DISABLED", "true")
        && !is("OTEL_TRACES_EXPORTER", "none")
}

fn build_provider(
    identity: &Identity,
) -> Result<SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()?;
    // Sampler (OTEL_TRACES_SAMPLER[_ARG]), span limits and batching (OTEL_BSP_*) come from
    // the SDK's own reading of the environment.
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource(identity, std::env::var("OTEL_SERVICE_NAME").ok()))
        .build())
}

/// The resource: defaults (service name, version, the pod's identity), then
/// `OTEL_RESOURCE_ATTRIBUTES`, then `service_name_env` (`OTEL_SERVICE_NAME`).
fn resource(identity: &Identity, service_name_env: Option<String>) -> Resource {
    use opentelemetry::KeyValue;
    use opentelemetry_sdk::resource::{EnvResourceDetector, TelemetryResourceDetector};
    let mut defaults = vec![
        KeyValue::new("service.name", DEFAULT_SERVICE_NAME),
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
    ];
    let attrs = [
        ("k8s.node.name", &identity.node_name),
        ("k8s.pod.name", &identity.pod_name),
        ("service.instance.id", &identity.pod_name),
        ("k8s.namespace.name", &identity.pod_namespace),
    ];
    for (key, value) in attrs {
        if let Some(v) = value {
            defaults.push(KeyValue::new(key, v.clone()));
        }
    }
    let mut builder = Resource::builder_empty()
        .with_attributes(defaults)
        .with_detectors(&[
            Box::new(TelemetryResourceDetector),
            Box::new(EnvResourceDetector::new()),
        ]);
    if let Some(name) = service_name_env.filter(|n| !n.is_empty()) {
        builder = builder.with_service_name(name);
    }
    builder.build()
}

/// Writes the W3C `traceparent` (and `tracestate`, when not empty) of the current span's
/// OpenTelemetry context into `headers`, replacing those the request came with.
///
/// Leaves `headers` untouched when the current span has no valid context (no exporter, or no
/// span): a `traceparent` is never made up, and one already in `headers` passes through.
pub fn inject_traceparent(headers: &mut HeaderMap) {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return;
    }
    TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
}

/// The remote parent named by the `traceparent` / `tracestate` of `headers`: an empty context
/// when there is none (or it is malformed).
pub fn extract_parent(headers: &HeaderMap) -> Context {
    if !headers.contains_key(TRACEPARENT) {
        return Context::new();
    }
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// Makes the trace context of `headers` (if any) the parent of `span`. Call it before the
/// span is first entered: once started, a span's parent is fixed. Does nothing without a
/// `traceparent`, or when `span` is disabled or has no OpenTelemetry layer.
pub fn set_parent_from_headers(span: &tracing::Span, headers: &HeaderMap) {
    if span.is_disabled() || !headers.contains_key(TRACEPARENT) {
        return;
    }
    let parent = extract_parent(headers);
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        let Ok(name) = HeaderName::from_bytes(key.as_bytes()) else {
            return;
        };
        if value.is_empty() && key == TRACESTATE {
            // Our context has no state: a stale one from the request must not stay.
            self.0.remove(name);
            return;
        }
        if let Ok(v) = HeaderValue::from_str(&value) {
            self.0.insert(name, v);
        }
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceId};
    use opentelemetry_otlp::WithExportConfig as _;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, Sampler};

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const PARENT: &str = "00f067aa0ba902b7";

    /// A subscriber exporting to the returned exporter. Keep the provider until the spans are
    /// read: its last drop shuts it down, and the in-memory exporter forgets on shutdown.
    fn subscriber(
        sampler: Sampler,
    ) -> (
        impl tracing::Subscriber,
        InMemorySpanExporter,
        SdkTracerProvider,
    ) {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .with_sampler(sampler)
            .build();
        let sub = tracing_subscriber::registry().with(otel_layer(provider.tracer("test")));
        (sub, exporter, provider)
    }

    fn incoming(flags: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            TRACEPARENT,
            HeaderValue::from_str(&format!("00-{TRACE}-{PARENT}-{flags}")).unwrap(),
        );
        h.insert(TRACESTATE, HeaderValue::from_static("vendor=abc"));
        h
    }

    /// (trace id, span id, flags) of a traceparent.
    fn parse(tp: &HeaderValue) -> (String, String, String) {
        let parts: Vec<&str> = tp.to_str().unwrap().split('-').collect();
        assert_eq!(parts.len(), 4, "{tp:?}");
        assert_eq!(parts[0], "00");
        (parts[1].into(), parts[2].into(), parts[3].into())
    }

    #[test]
    fn span_under_extracted_parent_joins_its_trace_and_inject_names_the_span() {
        let (sub, exporter, _provider) =
            subscriber(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
        let out = tracing::subscriber::with_default(sub, || {
            let span = tracing::info_span!("request");
            set_parent_from_headers(&span, &incoming("01"));
            let _entered = span.enter();
            let mut out = incoming("01");
            inject_traceparent(&mut out);
            out
        });
        let spans = exporter.get_finished_spans().unwrap();
        assert_eq!(spans.len(), 1);
        let span = &spans[0];
        assert_eq!(span.name, "request");
        assert_eq!(
            span.span_context.trace_id(),
            TraceId::from_hex(TRACE).unwrap()
        );
        assert_eq!(span.parent_span_id, SpanId::from_hex(PARENT).unwrap());
        let (trace, id, flags) = parse(&out[TRACEPARENT]);
        assert_eq!(trace, TRACE);
        assert_eq!(id, span.span_context.span_id().to_string());
        assert_ne!(id, PARENT, "the app's parent is the activator's span");
        assert_eq!(flags, "01");
        assert_eq!(out[TRACESTATE], "vendor=abc", "tracestate is carried on");
    }

    #[test]
    fn extract_parent_reads_the_remote_context() {
        let cx = extract_parent(&incoming("01"));
        let span = cx.span();
        let sc = span.span_context();
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(sc.trace_id(), TraceId::from_hex(TRACE).unwrap());
        assert_eq!(sc.span_id(), SpanId::from_hex(PARENT).unwrap());
        assert_eq!(sc.trace_state().header(), "vendor=abc");

        let none = extract_parent(&HeaderMap::new());
        assert!(!none.span().span_context().is_valid());
        let mut bad = HeaderMap::new();
        bad.insert(TRACEPARENT, HeaderValue::from_static("00-zz-yy-01"));
        assert!(!extract_parent(&bad).span().span_context().is_valid());
    }

    #[test]
    fn a_root_span_starts_a_trace() {
        let (sub, exporter, _provider) = subscriber(Sampler::AlwaysOn);
        let out = tracing::subscriber::with_default(sub, || {
            let span = tracing::info_span!("request");
            set_parent_from_headers(&span, &HeaderMap::new());
            let _entered = span.enter();
            let mut out = HeaderMap::new();
            inject_traceparent(&mut out);
            out
        });
        let spans = exporter.get_finished_spans().unwrap();
        assert_eq!(spans.len(), 1);
        let (trace, id, flags) = parse(&out[TRACEPARENT]);
        assert_eq!(trace, spans[0].span_context.trace_id().to_string());
        assert_eq!(id, spans[0].span_context.span_id().to_string());
        assert_eq!(flags, "01");
        assert!(!out.contains_key(TRACESTATE), "no empty tracestate");
    }

    #[test]
    fn an_unsampled_caller_is_followed_and_nothing_is_exported() {
        let (sub, exporter, _provider) =
            subscriber(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
        let out = tracing::subscriber::with_default(sub, || {
            let span = tracing::info_span!("request");
            set_parent_from_headers(&span, &incoming("00"));
            let _entered = span.enter();
            let mut out = HeaderMap::new();
            inject_traceparent(&mut out);
            out
        });
        assert!(exporter.get_finished_spans().unwrap().is_empty());
        let (trace, _, flags) = parse(&out[TRACEPARENT]);
        assert_eq!(trace, TRACE);
        assert_eq!(flags, "00", "the caller's decision is passed on");
    }

    #[test]
    fn without_an_exporter_headers_pass_through_untouched() {
        let sub = tracing_subscriber::registry();
        let out = tracing::subscriber::with_default(sub, || {
            let span = tracing::info_span!("request");
            set_parent_from_headers(&span, &incoming("01"));
            let _entered = span.enter();
            let mut out = incoming("01");
            inject_traceparent(&mut out);
            let mut empty = HeaderMap::new();
            inject_traceparent(&mut empty);
            assert!(empty.is_empty(), "no traceparent made up");
            out
        });
        assert_eq!(out, incoming("01"));
    }

    #[test]
    fn export_is_wanted_only_with_an_endpoint_and_not_disabled() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_string())
            }
        };
        assert!(!otlp_configured(env(&[])));
        assert!(otlp_configured(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://c:4317"
        )])));
        assert!(otlp_configured(env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c:4317"
        )])));
        assert!(!otlp_configured(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            " "
        )])));
        assert!(!otlp_configured(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ])));
        assert!(otlp_configured(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_SDK_DISABLED", "false"),
        ])));
        assert!(!otlp_configured(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ])));
    }

    #[test]
    fn the_resource_names_the_service_and_the_pod() {
        if std::env::var_os("OTEL_RESOURCE_ATTRIBUTES").is_some() {
            return; // the environment would override what this test checks
        }
        let id = Identity {
            node_name: Some("node-1".into()),
            pod_name: Some("act-x".into()),
            pod_namespace: Some("ns".into()),
        };
        let get = |r: &Resource, k: &'static str| r.get(&k.into()).map(|v| v.to_string());
        let r = resource(&id, None);
        assert_eq!(
            get(&r, "service.name").as_deref(),
            Some(DEFAULT_SERVICE_NAME)
        );
        assert_eq!(get(&r, "k8s.node.name").as_deref(), Some("node-1"));
        assert_eq!(get(&r, "k8s.pod.name").as_deref(), Some("act-x"));
        assert_eq!(get(&r, "k8s.namespace.name").as_deref(), Some("ns"));
        assert!(get(&r, "telemetry.sdk.name").is_some());
        let r = resource(&id, Some("edge".into()));
        assert_eq!(get(&r, "service.name").as_deref(), Some("edge"));
    }

    /// A collector that accepts connections and never answers: the shutdown still returns.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_is_bounded_when_the_collector_never_answers() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(format!("http://{addr}"))
            .build()
            .unwrap();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .build();
        let sub = tracing_subscriber::registry().with(otel_layer(provider.tracer("test")));
        tracing::subscriber::with_default(sub, || {
            let _s = tracing::info_span!("request").entered();
        });
        let telemetry = Telemetry {
            provider: Some(provider),
        };
        tokio::time::timeout(
            Duration::from_secs(60),
            telemetry.shutdown(Duration::from_millis(300)),
        )
        .await
        .expect("the telemetry shutdown hung");
    }
}
