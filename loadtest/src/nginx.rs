//! nginx as the reference reverse proxy: a config written to a temp dir (keep-alive upstream
//! to the pod, no access log), run in the foreground with `-p <dir> -c <conf>`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::Error;

/// `nginx` on PATH, else `/usr/sbin/nginx`.
pub fn find() -> Option<PathBuf> {
    find_program("nginx", &["/usr/sbin/nginx"])
}

/// The first executable `name` on PATH, else the first executable of `fallbacks`.
pub fn find_program(name: &str, fallbacks: &[&str]) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name))
        .chain(fallbacks.iter().map(PathBuf::from))
        .find(|p| executable(p))
}

/// The config: `daemon off`, `worker_processes auto`, an upstream with `keepalive 64` to
/// `upstream`, HTTP/1.1 to it with the `Connection` header cleared, `access_log off`,
/// with `forwarding` the client's Host passed on and the forwarding headers the activator
/// adds (`X-Forwarded-For`/`-Proto`/`-Host`, `Forwarded`), as an ingress is configured,
/// `keepalive_requests` high on both sides (as the activator, which never closes a keep-alive
/// connection after N requests), every path nginx writes under `dir`. `without` lists the modules nginx was built without (their
/// temp-path directives would be unknown).
pub fn config(
    dir: &Path,
    listen: SocketAddr,
    upstream: SocketAddr,
    without: &[&str],
    forwarding: bool,
) -> String {
    let d = dir.display();
    let fwd = if forwarding {
        "            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Forwarded-Host $http_host;
            proxy_set_header Forwarded \"for=$remote_addr;proto=$scheme;host=\\\"$http_host\\\"\";
"
    } else {
        ""
    };
    let mut temp =
        format!("    client_body_temp_path {d}/client_body;\n    proxy_temp_path {d}/proxy;\n");
    for m in ["fastcgi", "uwsgi", "scgi"] {
        if !without.contains(&m) {
            temp.push_str(&format!("    {m}_temp_path {d}/{m};\n"));
        }
    }
    format!(
        "daemon off;
worker_processes auto;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    # Keep client connections open for the whole run (the default closes them after 1,000
    # requests, which a load generator counts as errors or reconnects).
    keepalive_requests 10000000;
{temp}    upstream app {{
        server {upstream};
        keepalive 64;
        keepalive_requests 10000000;
    }}
    server {{
        listen {listen};
        location / {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
{fwd}        }}
    }}
}}
"
    )
}

/// The modules among fastcgi/uwsgi/scgi that `nginx -V` says were left out.
async fn modules_without(bin: &Path) -> Vec<&'static str> {
    let Ok(out) = Command::new(bin).arg("-V").output().await else {
        return Vec::new();
    };
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    ["fastcgi", "uwsgi", "scgi"]
        .into_iter()
        .filter(|m| text.contains(&format!("--without-http_{m}_module")))
        .collect()
}

/// A running nginx.
pub struct Nginx {
    child: Child,
    bin: PathBuf,
    dir: PathBuf,
    conf: PathBuf,
    pub addr: SocketAddr,
}

impl Nginx {
    /// Writes the config into `dir` and starts nginx listening on `listen`; returns once the
    /// port accepts connections. `forwarding`: see [`config`].
    pub async fn start(
        bin: &Path,
        dir: &Path,
        listen: SocketAddr,
        upstream: SocketAddr,
        forwarding: bool,
    ) -> Result<Self, Error> {
        let without = modules_without(bin).await;
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config(dir, listen, upstream, &without, forwarding))?;
        let err = |m: String| Error::Start {
            what: "nginx".into(),
            message: m,
        };
        let mut child = Command::new(bin)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| err(e.to_string()))?;
        let began = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
                return Err(err(format!("exited ({status}): {log}")));
            }
            if tokio::net::TcpStream::connect(listen).await.is_ok() {
                break;
            }
            if began.elapsed() > Duration::from_secs(10) {
                let _ = child.start_kill();
                return Err(err(format!("{listen} did not accept within 10 s")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tracing::info!(%listen, %upstream, conf = %conf.display(), "nginx started");
        Ok(Self {
            child,
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            conf,
            addr: listen,
        })
    }

    /// The master process (its workers are its children).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// `nginx -s stop` (the master takes its workers down), then reaps the master.
    pub async fn stop(mut self) {
        let _ = Command::new(&self.bin)
            .arg("-e")
            .arg(self.dir.join("error.log"))
            .arg("-p")
            .arg(&self.dir)
            .arg("-c")
            .arg(&self.conf)
            .arg("-s")
            .arg("stop")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config for /tmp/x, listening on 127.10.0.1:8081, to 127.10.0.2:8080.
    fn config_for(without: &[&str], forwarding: bool) -> String {
        config(
            Path::new("/tmp/x"),
            "127.10.0.1:8081".parse().unwrap(),
            "127.10.0.2:8080".parse().unwrap(),
            without,
            forwarding,
        )
    }

    fn assert_has(c: &str, wants: &[&str]) {
        for want in wants {
            assert!(c.contains(want), "{want} missing in\n{c}");
        }
    }

    #[test]
    fn config_has_keepalive_upstream_and_own_paths() {
        let c = config_for(&["uwsgi"], false);
        assert_has(
            &c,
            &[
                "daemon off;",
                "worker_processes auto;",
                "server 127.10.0.2:8080;",
                "keepalive 64;",
                "keepalive_requests 10000000;",
                "listen 127.10.0.1:8081;",
                "proxy_http_version 1.1;",
                "proxy_set_header Connection \"\";",
                "access_log off;",
                "pid /tmp/x/nginx.pid;",
                "scgi_temp_path /tmp/x/scgi;",
            ],
        );
        assert!(!c.contains("uwsgi_temp_path"));
        assert!(!c.contains("X-Forwarded-For"));
    }

    #[test]
    fn with_forwarding_the_host_and_the_forwarding_headers_are_set() {
        let c = config_for(&[], true);
        assert_has(
            &c,
            &[
                "proxy_set_header Host $http_host;",
                "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
                "proxy_set_header X-Forwarded-Proto $scheme;",
                "proxy_set_header X-Forwarded-Host $http_host;",
                r#"proxy_set_header Forwarded "for=$remote_addr;proto=$scheme;host=\"$http_host\"";"#,
            ],
        );
        // Inside the location, after the connection header.
        let location = c.find("location / {").unwrap();
        assert!(c.find("X-Forwarded-For").unwrap() > location);
    }
}
