//! What stops the controller, each failure its own variant, so that a bad configuration is told
//! apart from a port that can't be bound or a server that fails.

use std::{io, net::SocketAddr, path::PathBuf};

use crate::{
    auth::{grants::GrantFileError, tls::TlsSetupError, tokens::TokenError},
    kubernetes::apiserver::ApiError,
    store::StoreError,
};

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The store can't be used.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The sled store's directory can't be made private (another user owns it).
    #[error(transparent)]
    PrivateState(#[from] gpuwarden_runtime::private::PrivateDirError),
    /// The config file can't be used.
    #[error("config file {path}: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A listening address can't be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A bound listener can't say its own address.
    #[error("the listener's address: {0}")]
    LocalAddr(#[source] io::Error),
    /// The listener or the server failed.
    #[error("serving on {addr}: {source}")]
    Serve {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// Reflection could not be built.
    #[error("building gRPC reflection: {0}")]
    Reflection(String),
    /// Leader election was asked of a store that isn't etcd.
    #[error("{spec}: leader election needs an etcd store")]
    NotEtcd {
        /// The store.
        spec: String,
    },
    /// The TLS files can't be used.
    #[error(transparent)]
    Tls(#[from] TlsSetupError),
    /// The token file can't be used.
    #[error(transparent)]
    Tokens(#[from] TokenError),
    /// The grant file can't be used.
    #[error(transparent)]
    Grants(#[from] GrantFileError),
    /// The webhook or the extender can't be set up.
    #[error(transparent)]
    Kubernetes(#[from] KubeSetupError),
    /// The async runtime can't be started.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] io::Error),
    /// A task of the controller panicked or was cancelled.
    #[error(transparent)]
    Task(#[from] gpuwarden_runtime::lifecycle::TaskError),
    /// Only some of the TLS files are given.
    #[error("TLS needs a certificate, its key and a client CA; missing: {missing}")]
    IncompleteTls {
        /// The settings not given (flags; the config file's keys are the same with `_`).
        missing: String,
    },
    /// Plain text on an address other machines reach, without `--insecure`.
    #[error(
        "refusing to serve plain text on {addr} ({what}); give --tls-cert, --tls-key and \
         --tls-client-ca (clients then present a certificate or a --token-file token), listen \
         on a loopback address, or pass --insecure (config key `insecure = true`) to serve \
         plain text anyway"
    )]
    PlainTextExposed {
        /// The address.
        addr: SocketAddr,
        /// What would be exposed.
        what: &'static str,
    },
    /// The Prometheus endpoint would serve beyond loopback without `--prometheus-insecure`.
    #[error(transparent)]
    PrometheusExposed(#[from] gpuwarden_runtime::prometheus::ExposedError),
}

/// Why the webhook or the extender can't be set up.
#[derive(Debug, thiserror::Error)]
pub enum KubeSetupError {
    /// The webhook's port is given without its certificate.
    #[error("--webhook-listen needs --webhook-cert and --webhook-key")]
    MissingCert,
    /// The webhook's certificate can't be used.
    #[error("the webhook's certificate: {0}")]
    Cert(#[source] TlsSetupError),
    /// The API server the webhook makes claim templates through can't be used.
    #[error(transparent)]
    ApiServer(ApiError),
}
