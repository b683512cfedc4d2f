//! The Kubernetes side of `run`: the admission webhook (HTTPS) and the scheduler extender
//! (over the webhook's HTTPS port, or plain HTTP of its own), both off unless a listen address
//! is given. Bound before the store is opened, so a port in use stops the start; served as
//! tasks the app joins ([`super::app`]).

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use gpuwarden_runtime::lifecycle::{Stop, Tasks};
use tokio::net::TcpListener;

use crate::{
    hub::Hub,
    kubernetes::{
        admission::Marker,
        apiserver::{ApiError, ApiServer, BoxFuture, ClaimTemplates, Ensured},
        serve::{Hooks, ServingCert, serve_extender, serve_webhook},
        templates::Remembered,
    },
    limits::Bounds,
};

use super::{KubeSetupError, ServeError};

/// The Kubernetes side: the admission webhook and the scheduler extender (both off unless a
/// listen address is given).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct KubeArgs {
    /// Serve the mutating admission webhook (`POST /mutate`) and the scheduler extender
    /// (`/extender/filter`, `/extender/prioritize`) over HTTPS here; needs --webhook-cert and
    /// --webhook-key.
    #[arg(long, value_name = "ADDR")]
    pub webhook_listen: Option<SocketAddr>,
    /// The webhook's serving certificate (PEM), re-read when it changes.
    #[arg(long, value_name = "FILE", requires = "webhook_listen")]
    pub webhook_cert: Option<PathBuf>,
    /// Private key of --webhook-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "webhook_listen")]
    pub webhook_key: Option<PathBuf>,
    /// CA that signs the API server's webhook client certificate and kube-scheduler's extender
    /// client certificate (PEM): the HTTPS listener then refuses clients without one. Without
    /// it, anyone who reaches the port can send reviews (warned at start).
    #[arg(long, value_name = "FILE", requires = "webhook_listen")]
    pub webhook_client_ca: Option<PathBuf>,
    /// Leave `gpuwarden.io/gpu-milli` (a whole number) on the pods the webhook mutates, so that
    /// kube-scheduler calls the extender for those pods only: needs the extender configured with
    /// `managedResources: [{name: gpuwarden.io/gpu-milli, ignoredByScheduler: true}]`
    /// (`deploy/kubernetes/dra/scheduler.yaml`), else marked pods never schedule.
    #[arg(long)]
    pub webhook_extender_marker: bool,
    /// Serve the scheduler extender alone over plain HTTP here (for a kube-scheduler without a
    /// TLS config for extenders).
    #[arg(long, value_name = "ADDR")]
    pub extender_listen: Option<SocketAddr>,
    /// The Kubernetes API server the webhook makes `ResourceClaimTemplates` through (default:
    /// the in-cluster one, with the pod's service account).
    #[arg(long, value_name = "URL")]
    pub kube_api: Option<String>,
    /// CA of --kube-api (PEM).
    #[arg(long, value_name = "FILE", requires = "kube_api")]
    pub kube_ca: Option<PathBuf>,
    /// Bearer token file for --kube-api, re-read on every call.
    #[arg(long, value_name = "FILE", requires = "kube_api")]
    pub kube_token_file: Option<PathBuf>,
}

/// The Kubernetes listeners, bound and ready to serve.
pub(super) struct KubeListeners {
    webhook: Option<(TcpListener, Arc<ServingCert>)>,
    extender: Option<TcpListener>,
    templates: Arc<dyn ClaimTemplates>,
    marker: Marker,
}

/// Binds `addr`.
async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

impl KubeArgs {
    /// Loads the certificate, reaches for the API server and binds the listeners (none when
    /// neither listen address is given).
    ///
    /// # Errors
    /// The settings can't be used, or a port can't be bound.
    pub(super) async fn bind(self) -> Result<Option<KubeListeners>, ServeError> {
        if self.webhook_listen.is_none() && self.extender_listen.is_none() {
            return Ok(None);
        }
        let webhook = match self.webhook_listen {
            Some(addr) => {
                let (Some(cert), Some(key)) = (self.webhook_cert, self.webhook_key) else {
                    return Err(KubeSetupError::MissingCert.into());
                };
                if self.webhook_client_ca.is_none() {
                    tracing::warn!(
                        "--webhook-listen without --webhook-client-ca: anyone who reaches {addr} can send admission reviews and extender calls"
                    );
                }
                let cert = ServingCert::load_with_client_ca(cert, key, self.webhook_client_ca)
                    .map_err(KubeSetupError::Cert)?;
                Some((bind(addr).await?, Arc::new(cert)))
            }
            None => None,
        };
        let extender = match self.extender_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let api = match &self.kube_api {
            Some(url) => ApiServer::new(url, self.kube_ca.as_deref(), self.kube_token_file),
            None => ApiServer::in_cluster(),
        };
        let templates: Arc<dyn ClaimTemplates> = match api {
            Ok(api) => Arc::new(Remembered::new(Arc::new(api))),
            Err(e) if webhook.is_some() => return Err(KubeSetupError::ApiServer(e).into()),
            // The extender alone never calls the API server.
            Err(_) => Arc::new(NoApiServer),
        };
        Ok(Some(KubeListeners {
            webhook,
            extender,
            templates,
            marker: if self.webhook_extender_marker {
                Marker::ExtenderMarker
            } else {
                Marker::None
            },
        }))
    }
}

/// Where no API server is configured (only the extender runs).
struct NoApiServer;

impl ClaimTemplates for NoApiServer {
    fn ensure<'a>(
        &'a self,
        _: &'a str,
        _: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Ensured, ApiError>> {
        Box::pin(async { Err(ApiError::Setup("no API server configured".to_owned())) })
    }
}

impl KubeListeners {
    /// Serves them in tasks of the current runtime until `stop`, counting what they refuse in
    /// `bounds`; each task joins `tasks`, for the app to stop and join.
    pub(super) fn spawn(
        self,
        controller: &Arc<Hub>,
        bounds: &Arc<Bounds>,
        stop: &Stop,
        tasks: &mut Tasks<ServeError>,
    ) {
        let hooks = Arc::new(Hooks {
            controller: Arc::clone(controller),
            templates: self.templates,
            bounds: Arc::clone(bounds),
            marker: self.marker,
        });
        if let Some((listener, cert)) = self.webhook {
            let task = tokio::spawn(serve_webhook(
                listener,
                cert,
                Arc::clone(&hooks),
                stop.stopped(),
            ));
            let told = stop.clone();
            tasks.stop_with("webhook", task, move || told.stop());
        }
        if let Some(listener) = self.extender {
            let task = tokio::spawn(serve_extender(listener, hooks, stop.stopped()));
            let told = stop.clone();
            tasks.stop_with("extender", task, move || told.stop());
        }
    }
}
