//! One watcher's buffers and task, as kube-apiserver v1.28.7's `cacheWatcher`
//! (`staging/src/k8s.io/apiserver/pkg/storage/cacher/cache_watcher.go`): an `input` buffer the
//! dispatcher fills with every event offered to the watch, a `result` buffer of the same size
//! with the events that concern it, and a task between them (`processInterval`, `process`)
//! that first sends the watch's start (the initial ADDED events or the events it resumes
//! from), then takes each input, drops the ones at or below the start's resourceVersion,
//! applies the watch's selectors (`convertToWatchEvent`) and waits for room in `result`.
//! The HTTP response reads `result`. A client that stops reading fills the connection, then
//! `result`, then `input` — with events it does not even match — and the dispatcher closes it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::watch::{Input, Watcher};

/// Runs the watcher's task until its watch ends (client gone, stopped, forced close).
pub(crate) async fn process(
    w: Arc<Watcher>,
    start: Vec<Bytes>,
    mut input: mpsc::Receiver<Input>,
    result: mpsc::Sender<Bytes>,
) {
    let done = w.done.clone();
    tokio::select! {
        _ = done.cancelled() => {}
        _ = pump(&w, start, &mut input, &result) => {}
    }
}

async fn pump(
    w: &Watcher,
    start: Vec<Bytes>,
    input: &mut mpsc::Receiver<Input>,
    result: &mpsc::Sender<Bytes>,
) {
    for line in start {
        if !put(w, result, line).await {
            return;
        }
    }
    loop {
        let next = tokio::select! {
            biased;
            i = input.recv() => i,
            _ = result.closed() => None,
        };
        let line = match next {
            None => return,
            Some(Input::Line(l)) => l,
            Some(Input::Event(ev)) if ev.rv <= w.start_rv => continue,
            Some(Input::Event(ev)) => match ev.line_for(w) {
                Some(l) => l,
                None => continue,
            },
        };
        if !put(w, result, line).await {
            return;
        }
    }
}

async fn put(w: &Watcher, result: &mpsc::Sender<Bytes>, line: Bytes) -> bool {
    let ok = result.send(line).await.is_ok();
    if ok {
        w.stat.events.fetch_add(1, Ordering::Relaxed);
    }
    ok
}
