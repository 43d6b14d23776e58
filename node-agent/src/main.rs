//! The node agent binary: the CRI backend served on a unix socket. See docs/node-agent.md.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use node_agent::cri::CriBackend;
use node_agent::server::{ServerConfig, serve};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

#[derive(Parser, Debug)]
#[command(
    name = "node-agent",
    about = "Answers 'which IP does pod <uid> have on this node' and pulls images ahead of \
             their pods, from the container runtime, for the activator, over a unix socket"
)]
struct Args {
    /// The socket to serve (on the emptyDir shared with the activator container).
    #[arg(
        long,
        env = "NODE_AGENT_SOCKET",
        default_value = "/run/local-activator/agent.sock"
    )]
    listen: PathBuf,
    /// The container runtime's CRI socket: unix:///path or /path.
    #[arg(
        long,
        env = "CRI_ENDPOINT",
        default_value = "unix:///run/containerd/containerd.sock"
    )]
    cri_endpoint: String,
    /// The only uid allowed to connect (the activator container's runAsUser), or `any`.
    #[arg(long, env = "NODE_AGENT_CLIENT_UID", default_value = "65532", value_parser = client_uid)]
    client_uid: ClientUid,
    /// Connections served at once; more are closed at once.
    #[arg(long, env = "NODE_AGENT_MAX_CONNECTIONS", default_value_t = 16)]
    max_connections: usize,
    /// From the first byte of a request line to its end (e.g. 1s, 500ms).
    #[arg(long, env = "NODE_AGENT_LINE_TIMEOUT", default_value = "1s", value_parser = duration)]
    line_timeout: Duration,
    /// An idle connection is closed after this.
    #[arg(long, env = "NODE_AGENT_IDLE_TIMEOUT", default_value = "60s", value_parser = duration)]
    idle_timeout: Duration,
    /// The bound on each CRI call.
    #[arg(long, env = "NODE_AGENT_CRI_TIMEOUT", default_value = "1s", value_parser = duration)]
    cri_timeout: Duration,
    /// The bound on one image pull (`pull`; large images from a slow registry take minutes).
    #[arg(long, env = "NODE_AGENT_PULL_TIMEOUT", default_value = "10m", value_parser = duration)]
    pull_timeout: Duration,
    /// Image pulls in flight at once; one more is answered `error busy`.
    #[arg(long, env = "NODE_AGENT_MAX_PULLS", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    max_pulls: u16,
}

#[derive(Clone, Copy, Debug)]
enum ClientUid {
    Any,
    Only(u32),
}

fn client_uid(s: &str) -> Result<ClientUid, String> {
    if s == "any" {
        return Ok(ClientUid::Any);
    }
    s.parse()
        .map(ClientUid::Only)
        .map_err(|_| format!("{s:?} is neither a uid nor `any`"))
}

/// `<n>ms`, `<n>s` or `<n>m`.
fn duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?} (e.g. 1s, 500ms, 2m)");
    let (n, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| s.split_at(i))
        .ok_or_else(bad)?;
    let n: u64 = n.parse().map_err(|_| bad())?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(bad()),
    };
    if d.is_zero() {
        return Err(bad());
    }
    Ok(d)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        // Colour only on a terminal: a pod's log is a file, where escapes are noise.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let args = Args::parse();

    let listener = bind(&args.listen)?;
    let backend =
        CriBackend::connect_with_timeouts(&args.cri_endpoint, args.cri_timeout, args.pull_timeout)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    match backend.version().await {
        Ok(v) => tracing::info!(
            endpoint = %args.cri_endpoint,
            runtime = %v.runtime_name,
            version = %v.runtime_version,
            cri_api = %v.runtime_api_version,
            "container runtime"
        ),
        // Served anyway: the runtime may be restarting, and the channel reconnects; until then
        // each lookup answers `error runtime unreachable`.
        Err(e) => {
            tracing::warn!(endpoint = %args.cri_endpoint, error = %e, "the container runtime is not answering; serving anyway")
        }
    }

    let allowed_uid = match args.client_uid {
        ClientUid::Any => {
            tracing::warn!(
                "--client-uid any: every local process that can reach the socket is served"
            );
            None
        }
        ClientUid::Only(uid) => Some(uid),
    };
    let cfg = ServerConfig {
        max_connections: args.max_connections,
        line_timeout: args.line_timeout,
        idle_timeout: args.idle_timeout,
        allowed_uid,
        pull_timeout: args.pull_timeout,
        max_pulls: usize::from(args.max_pulls),
        ..ServerConfig::default()
    };
    tracing::info!(socket = %args.listen.display(), ?cfg, "serving");
    let stop = CancellationToken::new();
    let server = tokio::spawn(serve(listener, Arc::new(backend), cfg, stop.clone()));
    keep_serving::shutdown_signal().await;
    tracing::info!("stopping");
    stop.cancel();
    let _ = server.await;
    match std::fs::remove_file(&args.listen) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(error = %e, "removing the socket"),
    }
    Ok(())
}

/// Binds `path`, replacing a socket left by a previous run (a restarted container finds its
/// old socket file on the emptyDir) but nothing else: a regular file there is a mistake to
/// report, not to delete.
fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?,
        Ok(_) => bail!("{} exists and is not a socket", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("checking {}", path.display())),
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    // Anyone may connect: the activator runs as another uid than this agent, and the check
    // that matters is on the connection (the peer's uid), which a mode cannot express.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    Ok(listener)
}
