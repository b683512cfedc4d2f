//! The one thing the controller asks of the Kubernetes API server: that a `ResourceClaimTemplate`
//! exist in a namespace (`POST /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates`;
//! `201 Created`, or `409 AlreadyExists` when it is there already).
//!
//! [`ClaimTemplates`] is the seam: the webhook takes any implementation, tests a fake or a
//! loopback server. [`ApiServer`] is the real one, over the HTTPS client every gpuwarden binary
//! shares with Kubernetes ([`gpuwarden_kube`]).

use std::{
    future::Future,
    path::{Path, PathBuf},
    pin::Pin,
};

use gpuwarden_kube::{Endpoint, KubeClient, KubeError};
use serde_json::Value;

/// What [`ClaimTemplates::ensure`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// It made the template.
    Created,
    /// The template was there already.
    Existed,
}

/// Why the API server could not be asked, or refused.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The settings can't be used (URL, CA, token file).
    #[error("API server settings: {0}")]
    Setup(String),
    /// Connecting, TLS, HTTP or the token file failed.
    #[error(transparent)]
    Transport(#[from] KubeError),
    /// New templates are being asked for faster than they are made (a flood of reviews).
    #[error("more than {per_sec} new claim templates a second are being asked for; retry")]
    Throttled {
        /// The sustained rate.
        per_sec: u32,
    },
    /// The API server answered with an error status.
    #[error("API server answered {status}: {message}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// Its `Status.message`, or the body.
        message: String,
    },
}

/// A boxed future, as the trait's methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Makes sure `ResourceClaimTemplates` exist.
pub trait ClaimTemplates: Send + Sync {
    /// Creates `template` (a whole `ResourceClaimTemplate` object) in `namespace` unless one of
    /// its name is there.
    fn ensure<'a>(
        &'a self,
        namespace: &'a str,
        template: &'a Value,
    ) -> BoxFuture<'a, Result<Ensured, ApiError>>;
}

/// The Kubernetes API server, reached over HTTPS with a bearer token.
#[derive(Debug)]
pub struct ApiServer(KubeClient);

impl ApiServer {
    /// The API server at `url` (`https://host:port`; `http://` only for tests on loopback),
    /// trusting `ca` (PEM) and sending the token in `token_file`, when given.
    ///
    /// # Errors
    /// The URL or the CA can't be used.
    pub fn new(
        url: &str,
        ca: Option<&Path>,
        token_file: Option<PathBuf>,
    ) -> Result<Self, ApiError> {
        let endpoint = Endpoint {
            ca_hint: "give --kube-ca",
            ..Endpoint::api_server(
                url.trim_end_matches('/').to_owned(),
                ca.map(Path::to_path_buf),
                token_file,
            )
        };
        KubeClient::new(&endpoint)
            .map(Self)
            .map_err(|e| ApiError::Setup(e.to_string()))
    }

    /// The API server a pod reaches: `KUBERNETES_SERVICE_HOST`/`_PORT`, with the mounted
    /// service account's CA and token.
    ///
    /// # Errors
    /// Not in a pod (the variables are unset), or the CA can't be read.
    pub fn in_cluster() -> Result<Self, ApiError> {
        let endpoint = Endpoint::in_cluster_api_server().ok_or_else(|| {
            ApiError::Setup(
                "KUBERNETES_SERVICE_HOST is not set (not in a pod? give --kube-api)".to_owned(),
            )
        })?;
        KubeClient::new(&endpoint)
            .map(Self)
            .map_err(|e| ApiError::Setup(e.to_string()))
    }
}

impl ClaimTemplates for ApiServer {
    fn ensure<'a>(
        &'a self,
        namespace: &'a str,
        template: &'a Value,
    ) -> BoxFuture<'a, Result<Ensured, ApiError>> {
        Box::pin(async move {
            let path =
                format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates");
            let answer = self
                .0
                .request(http::Method::POST, &path, Some(template))
                .await?;
            match answer.status {
                200 | 201 => Ok(Ensured::Created),
                409 => Ok(Ensured::Existed),
                status => Err(ApiError::Status {
                    status,
                    message: answer.message(),
                }),
            }
        })
    }
}
