//! The shutdown signal of the product's binaries.

/// Resolves at SIGTERM (what the kubelet sends) or ctrl-c. Never fails: a handler that cannot
/// be installed is logged and the other one is waited for, since a process that stopped at
/// once would drop its traffic, and one that panicked would be restarted to fail the same
/// way; with neither handler this never resolves (the process still ends at SIGKILL).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "listening for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "installing the SIGTERM handler");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn sigterm_resolves_it() {
        let mut signal = std::pin::pin!(shutdown_signal());
        // One poll installs both handlers, so the SIGTERM below is caught, not fatal.
        tokio::select! {
            biased;
            () = &mut signal => panic!("resolved before any signal"),
            () = std::future::ready(()) => {}
        }
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .expect("running kill");
        assert!(sent.success());
        tokio::time::timeout(Duration::from_secs(10), signal)
            .await
            .expect("SIGTERM resolves the shutdown signal");
    }
}
