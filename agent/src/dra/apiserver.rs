//! The few API-server calls the DRA plugin makes: GET a ResourceClaim, GET/POST/PUT/DELETE the
//! node's ResourceSlice and a watch on it, over the HTTPS client every gpuwarden binary shares with
//! Kubernetes ([`gpuwarden_kube`]: one connection per request, TLS with ring, the
//! bearer token read at each request so rotated service-account tokens are picked up).
//!
//! Why not the `kube` crate: these calls need one watch, no informer and no generated types
//! beyond the fields read and written here; `kube` + `k8s-openapi` would add minutes of build to
//! every agent build on small CI machines.

use gpuwarden_kube::{Endpoint, KubeClient, KubeError};

pub use gpuwarden_kube::Answer;

use super::config::ApiServerConfig;

/// Errors talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No answer: the settings, the connection, TLS, HTTP, the token file, the time limit.
    #[error(transparent)]
    Request(#[from] KubeError),
    /// The body is not the JSON expected.
    #[error("API server body: {0}")]
    Body(String),
    /// A status other than the ones expected.
    #[error("{method} {path}: HTTP {status}: {message}")]
    Status {
        /// The method.
        method: String,
        /// The path.
        path: String,
        /// The status code.
        status: u16,
        /// The `Status` object's message, or the body's start.
        message: String,
    },
}

impl ApiError {
    /// The error a non-2xx `answer` to `method path` stands for, with the API's own message.
    #[must_use]
    pub fn status(answer: &Answer, method: &str, path: &str) -> Self {
        Self::Status {
            method: method.to_owned(),
            path: path.to_owned(),
            status: answer.status,
            message: answer.message(),
        }
    }
}

/// The body of `answer` to `method path` as JSON, when its status is 2xx.
///
/// # Errors
/// [`ApiError::Status`] for a non-2xx status, [`ApiError::Body`] for a body that isn't the JSON
/// expected.
pub fn json<T: serde::de::DeserializeOwned>(
    answer: &Answer,
    method: &str,
    path: &str,
) -> Result<T, ApiError> {
    if !answer.is_success() {
        return Err(ApiError::status(answer, method, path));
    }
    serde_json::from_slice(&answer.body).map_err(|e| ApiError::Body(format!("{path}: {e}")))
}

/// The API server client.
#[derive(Debug)]
pub struct ApiServer(KubeClient);

impl ApiServer {
    /// A client for `config`.
    ///
    /// # Errors
    /// A bad URL or CA file.
    pub fn new(config: &ApiServerConfig) -> Result<Self, ApiError> {
        let endpoint = Endpoint {
            ca_hint: "set [dra] api_ca_file",
            ..Endpoint::api_server(
                config.url.clone(),
                config.ca_file.clone(),
                config.token_file.clone(),
            )
        };
        Ok(Self(KubeClient::new(&endpoint)?))
    }

    /// Sends `method path` with an optional JSON body, and returns the answer whatever its
    /// status.
    ///
    /// # Errors
    /// No answer: connection, TLS, HTTP, token file, time-out.
    pub async fn request(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, ApiError> {
        Ok(self.0.request(method, path, body).await?)
    }

    /// Watches `path` (a `?watch=true` URL), each event into `events`, until the server ends
    /// the watch; the answer's status (and body, when it is not 200).
    ///
    /// # Errors
    /// No answer, or a broken stream.
    pub async fn watch(
        &self,
        path: &str,
        events: &tokio::sync::mpsc::Sender<serde_json::Value>,
    ) -> Result<Answer, ApiError> {
        Ok(self.0.watch(path, events).await?)
    }
}
