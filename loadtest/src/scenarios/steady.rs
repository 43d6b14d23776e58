//! `steady`: warm traffic at a fixed arrival rate (open loop: requests leave on schedule,
//! latency counts from the intended send time) through the revision's member activator, and
//! in the same run the same schedule sent straight to the app pod and through nginx (when an
//! `nginx` binary is installed), reported as ratios.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

use super::common::Sender;
use crate::Error;
use crate::nginx::{self, Nginx};
use crate::open_loop::{Fate, Latency, OpenLoop, Run};
use crate::plot;
use crate::scenario::{Ctx, Knobs, Outcome, Report, Scenario, create_revisions, revision_names};

/// Slices per target, taken in turns.
const ROUNDS: u32 = 5;

pub fn defaults() -> Knobs {
    Knobs {
        nodes: Some(3),
        revisions: Some(1),
        activators: Some(1),
        rate: Some(500.0),
        duration_secs: Some(5.0),
        start_delay_ms: Some(100),
        ..Knobs::default()
    }
}

/// One target's figures.
fn figures(run: &Run) -> serde_json::Value {
    json!({
        "due": run.due(),
        "sent": run.sent(),
        "errors": run.errors(),
        "failed": run.count(Fate::Failed) + run.count(Fate::Panicked),
        "overflow": run.overflow(),
        "overflowed_at_s": super::common::overflowed_at(run),
        "aborted": run.count(Fate::Aborted),
        "throughput_rps": run.throughput(),
        "latency_ms": run.latency(),
        "service_ms": run.service(),
        "send_lag_ms": run.send_lag(),
    })
}

/// A latency figure for the table: `failed` when the percentile falls among the requests
/// that got no answer.
fn ms(v: f64, width: usize) -> String {
    if v.is_finite() {
        format!("{v:>width$.3}")
    } else {
        format!("{:>width$}", "failed")
    }
}

fn line(name: &str, run: &Run) -> String {
    let l = run.latency();
    let sv = run.service();
    let mut o = format!(
        "{name:<10} sent {:>6}  errors {:>4}  p50 {}  p90 {}  p99 {}  p99.9 {}  max {} ms  ({:.0} req/s answered)\n{:<10} from the actual send: p50 {}  p99 {} ms (send lag p50 {:.3} ms)\n",
        run.sent(),
        run.errors(),
        ms(l.p50, 7),
        ms(l.p90, 7),
        ms(l.p99, 7),
        ms(l.p999, 7),
        ms(l.max, 8),
        run.throughput(),
        "",
        ms(sv.p50, 7),
        ms(sv.p99, 7),
        run.send_lag().p50
    );
    if !l.clean() {
        o += &format!(
            "{:<10} of {} due: {} failed, {} did not complete within the run ({} never sent: \
             due while {} were outstanding); all ranked after every answer ({:.2} % failed)\n",
            "",
            l.count,
            l.failed,
            l.incomplete,
            run.overflow(),
            "max_in_flight",
            100.0 * l.failed_share()
        );
    }
    o
}

/// The activator's latency over `base`'s, with both sides' error counts; refused (`valid`
/// false, no ratio) when either side has one: a ratio against a side whose failures are
/// missing from it compares two different things.
fn ratio(a: &Run, b: &Run, of: impl Fn(&Run) -> Latency) -> serde_json::Value {
    let (la, lb) = (of(a), of(b));
    let valid = a.errors() == 0 && b.errors() == 0;
    let r = |x: f64, y: f64| valid.then(|| x / y.max(1e-9));
    json!({
        "valid": valid,
        "activator_errors": a.errors(),
        "base_errors": b.errors(),
        "p50": r(la.p50, lb.p50),
        "p99": r(la.p99, lb.p99),
    })
}

pub async fn run(ctx: &Ctx) -> Result<Report, Error> {
    let k = ctx.knobs.clone().or(defaults());
    let schedule = OpenLoop {
        rate: k.rate.unwrap_or(1.0).max(1.0),
        duration: Duration::from_secs_f64(k.duration_secs.unwrap_or(1.0).max(0.1)),
        max_in_flight: 10_000,
    };
    ctx.on_cluster(Scenario::Steady, &k, |_| {}, async |cluster, ns| {
        let names = revision_names(k.revisions.unwrap_or(1).max(1));
        create_revisions(cluster, ns, &names, |_| {}).await?;
        let sender = Sender::new(ns, k.by_host()?);
        // A member of the first revision, so the activator path has no forward in it.
        let aep: kube::Api<crds::ActivationEndpoints> =
            kube::Api::namespaced(cluster.client.clone(), ns);
        let member = aep
            .get(&names[0])
            .await?
            .status
            .and_then(|s| s.activators.first().map(|m| m.node.clone()))
            .ok_or_else(|| Error::Options("the first revision has no member".into()))?;
        let entry = cluster
            .entries()
            .into_iter()
            .find(|(n, _)| *n == member)
            .ok_or_else(|| Error::Options(format!("no activator on {member}")))?;
        ctx.step("waking the revisions");
        let mut pod = None;
        for name in &names {
            let s = sender.send(&entry, name, &[]).await;
            if !s.ok() {
                return Err(Error::Options(format!("warm-up of {name} failed: {:?}", s.error)));
            }
            pod = pod.or(s.pod);
        }
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(cluster.client.clone(), ns);
        let pod_name = pod.ok_or_else(|| Error::Options("no x-pod-name in the answer".into()))?;
        let pod_ip: std::net::IpAddr = pods
            .get(&pod_name)
            .await?
            .status
            .and_then(|s| s.pod_ip)
            .and_then(|ip| ip.parse().ok())
            .ok_or_else(|| Error::Options(format!("pod {pod_name} has no IP")))?;
        let pod_addr = SocketAddr::new(pod_ip, crds::revision::DEFAULT_PORT as u16);

        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(2)));
        // No hidden retries, as for the activator's requests (see `Driver`).
        let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
            .retry_canceled_requests(false)
            .build(http);
        let get = |addr: SocketAddr| {
            let client = client.clone();
            move |_| {
                let client = client.clone();
                async move {
                    let uri = format!("http://{addr}/").parse().expect("a valid URI");
                    match client.get(uri).await {
                        Ok(r) => {
                            let ok = r.status().is_success();
                            ok && http_body_util::BodyExt::collect(r.into_body()).await.is_ok()
                        }
                        Err(_) => false,
                    }
                }
            }
        };
        let nginx_dir = std::env::temp_dir().join(format!("loadtest-nginx-{ns}"));
        let nginx = match nginx::find() {
            None => Err("no nginx binary on PATH or at /usr/sbin/nginx: not measured".to_string()),
            Some(bin) => {
                std::fs::create_dir_all(&nginx_dir)?;
                let ip = entry.1.ip();
                let port = std::net::TcpListener::bind((ip, 0))?.local_addr()?.port();
                Nginx::start(&bin, &nginx_dir, SocketAddr::new(ip, port), pod_addr, false)
                    .await
                    .map_err(|e| format!("nginx did not start, not measured: {e}"))
            }
        };
        let nginx_addr = nginx.as_ref().ok().map(|n| n.addr);
        // The targets take turns in short slices, so that a warmer machine, a fuller cache or
        // a noisy neighbour late in the run does not favour whichever target ran last.
        let mut runs: Vec<(&'static str, Run)> = vec![("direct", Run::empty())];
        if nginx_addr.is_some() {
            runs.push(("nginx", Run::empty()));
        }
        runs.push(("activator", Run::empty()));
        let slice = OpenLoop {
            duration: schedule.duration / ROUNDS,
            ..schedule
        };
        let rev_count = names.len();
        for round in 0..ROUNDS {
            for (name, total) in runs.iter_mut() {
                if ctx.cancel.is_cancelled() {
                    break;
                }
                ctx.step(format!("round {} of {ROUNDS}: {name}", round + 1));
                let run = match *name {
                    "direct" => slice.run(&ctx.cancel, get(pod_addr)).await,
                    "nginx" => match nginx_addr {
                        Some(addr) => slice.run(&ctx.cancel, get(addr)).await,
                        None => continue,
                    },
                    _ => {
                        slice
                            .run(&ctx.cancel, |i| {
                                let (sender, entry) = (sender.clone(), entry.clone());
                                let rev = names[i as usize % rev_count].clone();
                                async move { sender.send(&entry, &rev, &[]).await.ok() }
                            })
                            .await
                    }
                };
                total.absorb(run);
            }
        }
        let nginx_note = nginx.as_ref().err().cloned();
        if let Ok(n) = nginx {
            n.stop().await;
        }
        let _ = std::fs::remove_dir_all(&nginx_dir);

        let find = |n: &str| runs.iter().find(|(name, _)| *name == n).map(|(_, r)| r);
        let mut targets = serde_json::Map::new();
        let mut text = format!(
            "steady: {} req/s for {:.1} s per target in {ROUNDS} interleaved slices, open loop (latency from the intended send time)\n",
            schedule.rate,
            schedule.duration.as_secs_f64()
        );
        for (name, run) in &runs {
            targets.insert(name.to_string(), figures(run));
            text += &line(name, run);
        }
        if let Some(note) = &nginx_note {
            text += &format!("nginx      {note}\n");
        }
        let mut ratios = serde_json::Map::new();
        if let Some(a) = find("activator") {
            for base in ["direct", "nginx"] {
                if let Some(b) = find(base) {
                    let r = ratio(a, b, Run::latency);
                    let sv = ratio(a, b, Run::service);
                    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
                    if r["valid"] == true {
                        text += &format!(
                            "activator ÷ {base:<6}  latency p50 {:.2}×  p99 {:.2}×; from the actual send p50 {:.2}×  p99 {:.2}×  (errors: activator 0, {base} 0)\n",
                            f(&r, "p50"),
                            f(&r, "p99"),
                            f(&sv, "p50"),
                            f(&sv, "p99")
                        );
                    } else {
                        text += &format!(
                            "activator ÷ {base:<6}  INVALID, not computed: errors: activator {}, {base} {}\n",
                            a.errors(),
                            b.errors()
                        );
                    }
                    ratios.insert(format!("activator_over_{base}"), r);
                    ratios.insert(format!("activator_over_{base}_from_send"), sv);
                }
            }
        }
        // Every request due: one with no answer is infinite, so each curve ends at the
        // share answered.
        let series: Vec<(&str, Vec<f64>)> = runs
            .iter()
            .map(|(name, run)| {
                let ms = run
                    .outcomes
                    .iter()
                    .map(|o| {
                        if o.ok() {
                            o.latency.as_secs_f64() * 1e3
                        } else {
                            f64::INFINITY
                        }
                    })
                    .collect();
                (*name, ms)
            })
            .collect();
        Ok(Outcome {
            figures: json!({
                "rate": schedule.rate,
                "duration_secs": schedule.duration.as_secs_f64(),
                "targets": targets,
                "ratios": ratios,
                "nginx": nginx_note.unwrap_or_else(|| "measured".into()),
                "errors": runs.iter().map(|(_, r)| r.errors()).sum::<u64>(),
            }),
            text,
            plots: vec![("cdf", plot::cdf("steady: warm latency CDF, open loop", &series)?)],
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::open_loop::Outcome;

    fn run(ms: &[u64], fates: &[Fate]) -> Run {
        Run {
            outcomes: ms
                .iter()
                .zip(fates)
                .enumerate()
                .map(|(i, (ms, fate))| Outcome {
                    intended: Duration::from_millis(i as u64),
                    send_lag: Duration::ZERO,
                    latency: Duration::from_millis(*ms),
                    fate: *fate,
                })
                .collect(),
            cancelled: false,
            elapsed: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_ratio_carries_both_sides_errors_and_is_refused_when_either_has_one() {
        let ok = [Fate::Answered; 4];
        let (a, b) = (run(&[2, 2, 2, 2], &ok), run(&[1, 1, 1, 1], &ok));
        let r = ratio(&a, &b, Run::latency);
        assert_eq!(r["valid"], true, "{r}");
        assert!((r["p50"].as_f64().unwrap() - 2.0).abs() < 0.01, "{r}");
        // The base answered fast with one failure (a fast 503, say): no ratio.
        let failing = [Fate::Answered, Fate::Answered, Fate::Answered, Fate::Failed];
        for (a, b, errors) in [
            (&a, &run(&[1, 1, 1, 1], &failing), (0, 1)),
            (&run(&[2, 2, 2, 0], &failing), &b, (1, 0)),
        ] {
            let r = ratio(a, b, Run::service);
            assert_eq!(r["valid"], false, "{r}");
            assert!(r["p50"].is_null() && r["p99"].is_null(), "{r}");
            assert_eq!(
                (r["activator_errors"].as_u64(), r["base_errors"].as_u64()),
                (Some(errors.0), Some(errors.1))
            );
        }
        // A request never sent is an error too.
        let unsent = run(
            &[1, 1, 1, 1],
            &[
                Fate::Answered,
                Fate::Answered,
                Fate::Answered,
                Fate::Overflowed,
            ],
        );
        assert_eq!(ratio(&a, &unsent, Run::latency)["valid"], false);
    }
}
