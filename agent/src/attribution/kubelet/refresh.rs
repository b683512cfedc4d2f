//! The task that keeps the pod names fresh: on a schedule, and sooner when a look-up misses.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Instant,
};

use super::{KubeletConfig, KubeletError, KubeletStatus, PodName, client::Client};

#[derive(Default)]
pub(super) struct Cache {
    pub(super) pods: HashMap<String, PodName>,
    /// UIDs looked up and not found since the last request.
    pub(super) missed: HashSet<String>,
    /// UIDs the last request did not list either: not asked for again until the next
    /// scheduled refresh.
    pub(super) unknown: HashSet<String>,
    pub(super) status: KubeletStatus,
}

pub(super) struct Inner {
    pub(super) cache: Mutex<Cache>,
    pub(super) wake: tokio::sync::Notify,
}

pub(super) async fn refresh_loop(config: KubeletConfig, inner: Arc<Inner>) {
    let client = match Client::new(&config) {
        Ok(client) => client,
        Err(e) => {
            tracing::warn!(url = %config.url, "pod names off: {e}");
            record(&inner, &config.url, Err(&e));
            return;
        }
    };
    if config.insecure_skip_tls_verify && client.0.is_tls() {
        tracing::warn!(url = %config.url, "the kubelet's certificate is NOT verified (kubelet_insecure_skip_tls_verify)");
    }
    let mut next_scheduled = Instant::now();
    loop {
        let scheduled = Instant::now() >= next_scheduled;
        if scheduled {
            next_scheduled = Instant::now() + config.refresh;
        }
        let result = client.pods().await;
        let requested = {
            let mut cache = inner.cache.locked();
            if scheduled {
                cache.unknown.clear();
            }
            std::mem::take(&mut cache.missed)
        };
        // On an error the last good list stays: a kubelet restarting for a moment loses no names.
        if let Ok(pods) = &result {
            let mut cache = inner.cache.locked();
            cache.pods.clone_from(pods);
            let unknown: Vec<String> = requested
                .into_iter()
                .filter(|uid| !pods.contains_key(uid))
                .collect();
            cache.unknown.extend(unknown);
        }
        record(&inner, &config.url, result.as_ref().map(HashMap::len));
        let miss_allowed = Instant::now() + config.miss_interval;
        tokio::select! {
            () = tokio::time::sleep_until(next_scheduled.into()) => {}
            () = inner.wake.notified() => {
                // A look-up missed: refresh, but not more often than miss_interval.
                tokio::time::sleep_until(miss_allowed.min(next_scheduled).into()).await;
            }
        }
    }
}

/// Counts a request's result and logs a change of state.
fn record(inner: &Inner, url: &str, result: Result<usize, &KubeletError>) {
    let mut cache = inner.cache.locked();
    let status = &mut cache.status;
    let label = match result {
        Ok(_) => "ok",
        Err(e) => e.label(),
    };
    *status.requests.entry(label.to_owned()).or_default() += 1;
    if status.state != label {
        match result {
            Ok(n) => tracing::info!(%url, pods = n, "pod names from the kubelet"),
            Err(e) => {
                tracing::warn!(%url, result = label, "pod names unavailable (names stay absent): {e}");
            }
        }
    }
    label.clone_into(&mut status.state);
    match result {
        Ok(n) => {
            status.pods = n as u64;
            status.error = None;
        }
        Err(e) => status.error = Some(e.to_string()),
    }
}
