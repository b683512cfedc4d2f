//! The kubelet's pod list, over the HTTPS client every gpuwarden binary shares with Kubernetes
//! ([`gpuwarden_kube`]).

use std::{collections::HashMap, time::Duration};

use gpuwarden_kube::{Endpoint, KubeClient};

use super::{KubeletConfig, KubeletError, PodName, parse_pod_list};

/// Largest pod list read (a node's 110 pods are a few MB at most).
const MAX_BODY: usize = 64 << 20;

/// One request's time limit, connect to last byte.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// One-request-at-a-time client for the pod list.
pub(super) struct Client(pub(super) KubeClient);

impl Client {
    pub(super) fn new(config: &KubeletConfig) -> Result<Self, KubeletError> {
        let endpoint = Endpoint {
            peer: "the kubelet",
            url: config.url.clone(),
            ca_file: config.ca_file.clone(),
            insecure_skip_tls_verify: config.insecure_skip_tls_verify,
            token_file: config.token_file.clone(),
            ca_hint: "set kubelet_ca_file, or kubelet_insecure_skip_tls_verify",
            timeout: REQUEST_TIMEOUT,
            max_body: MAX_BODY,
        };
        Ok(Self(KubeClient::new(&endpoint)?))
    }

    pub(super) async fn pods(&self) -> Result<HashMap<String, PodName>, KubeletError> {
        let answer = self
            .0
            .request(http::Method::GET, self.0.url_path(), None)
            .await?;
        match answer.status {
            200 => parse_pod_list(&answer.body),
            401 => Err(KubeletError::Unauthorized),
            403 => Err(KubeletError::Forbidden),
            status => Err(KubeletError::Status { status }),
        }
    }
}

#[cfg(test)]
mod tests;
