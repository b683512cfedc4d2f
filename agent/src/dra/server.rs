//! The kubelet's side of the plugin: `pluginregistration.Registration` on the registration
//! socket (the kubelet's plugin watcher finds it under `plugins_registry`), and `DRAPlugin` v1
//! and v1beta1 on the plugin's own socket. Both are gRPC over Unix sockets.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use gpuwarden_proto::kubelet::{
    DRA_PLUGIN_TYPE, DRA_VERSIONS, dra_v1 as v1, dra_v1beta1 as v1beta1, pluginregistration as reg,
};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::{
    DRIVER_NAME,
    plugin::{ClaimRef, Driver},
    store::Prepared,
};

/// The registration status the kubelet last sent, and a wake-up for whoever waits on the next.
#[derive(Debug, Default)]
pub struct Registered {
    status: Mutex<Option<reg::RegistrationStatus>>,
    changed: tokio::sync::Notify,
}

impl Registered {
    /// The status the kubelet last sent.
    #[must_use]
    pub fn status(&self) -> Option<reg::RegistrationStatus> {
        self.status.locked().clone()
    }

    /// Keeps `status` and wakes the waiter (a wake-up sent while nobody waits is kept).
    fn set(&self, status: reg::RegistrationStatus) {
        *self.status.locked() = Some(status);
        self.changed.notify_one();
    }

    /// Returns once the kubelet sends a status: it (re)registered the plugin — after a kubelet
    /// restart, which deleted the node's ResourceSlices.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// The registration as the plugin and the slice publisher share it.
pub type RegistrationSeen = Arc<Registered>;

/// `pluginregistration.Registration`.
struct Registration {
    endpoint: PathBuf,
    seen: RegistrationSeen,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for Registration {
    async fn get_info(
        &self,
        _request: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: DRA_PLUGIN_TYPE.to_owned(),
            name: DRIVER_NAME.to_owned(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: DRA_VERSIONS.iter().map(|&v| v.to_owned()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!("{DRIVER_NAME}: registered with the kubelet");
        } else {
            tracing::error!(
                "{DRIVER_NAME}: the kubelet refused the registration: {}",
                status.error
            );
        }
        self.seen.set(status);
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// `DRAPlugin`, both versions, over the same driver.
#[derive(Clone)]
struct Plugin(Arc<Driver>);

/// Prepares each claim; the answers keyed by claim UID, an error per claim as text.
async fn prepare_all(
    driver: &Driver,
    claims: Vec<ClaimRef>,
) -> Vec<(String, Result<Prepared, String>)> {
    let mut answers = Vec::with_capacity(claims.len());
    for claim in claims {
        let answer = driver.prepare(&claim).await;
        if let Err(e) = &answer {
            tracing::warn!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, "{DRIVER_NAME}: prepare: {e}");
        }
        answers.push((claim.uid, answer));
    }
    answers
}

async fn unprepare_all(driver: &Driver, claims: Vec<ClaimRef>) -> Vec<(String, String)> {
    let mut answers = Vec::with_capacity(claims.len());
    for claim in claims {
        let error = driver.unprepare(&claim).await.err().unwrap_or_default();
        answers.push((claim.uid, error));
    }
    answers
}

/// Implements `DRAPlugin` of version `$v` on [`Plugin`]: the versions differ only in their
/// generated types and in a prepared device's fields, which `$device` builds from the prepared
/// device `$d` and the claim's CDI device ids `$cdi`.
macro_rules! dra_plugin {
    ($v:ident, |$d:ident, $cdi:ident| $device:expr) => {
        #[tonic::async_trait]
        impl $v::dra_plugin_server::DraPlugin for Plugin {
            async fn node_prepare_resources(
                &self,
                request: Request<$v::NodePrepareResourcesRequest>,
            ) -> Result<Response<$v::NodePrepareResourcesResponse>, Status> {
                let claims = request.into_inner().claims.into_iter().map(|c| ClaimRef {
                    namespace: c.namespace,
                    uid: c.uid,
                    name: c.name,
                });
                let claims = prepare_all(&self.0, claims.collect()).await;
                Ok(Response::new($v::NodePrepareResourcesResponse {
                    claims: claims
                        .into_iter()
                        .map(|(uid, answer)| {
                            let response = match answer {
                                Ok(p) => $v::NodePrepareResourceResponse {
                                    devices: p
                                        .devices
                                        .iter()
                                        .map(|$d| {
                                            let $cdi = &p.cdi_device_ids;
                                            $device
                                        })
                                        .collect(),
                                    error: String::new(),
                                },
                                Err(error) => $v::NodePrepareResourceResponse {
                                    devices: vec![],
                                    error,
                                },
                            };
                            (uid, response)
                        })
                        .collect(),
                }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$v::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$v::NodeUnprepareResourcesResponse>, Status> {
                let claims = request.into_inner().claims.into_iter().map(|c| ClaimRef {
                    namespace: c.namespace,
                    uid: c.uid,
                    name: c.name,
                });
                Ok(Response::new($v::NodeUnprepareResourcesResponse {
                    claims: unprepare_all(&self.0, claims.collect())
                        .await
                        .into_iter()
                        .map(|(uid, error)| (uid, $v::NodeUnprepareResourceResponse { error }))
                        .collect(),
                }))
            }
        }
    };
}

dra_plugin!(v1, |d, cdi| v1::Device {
    request_names: vec![d.request.clone()],
    pool_name: d.pool.clone(),
    device_name: d.device.clone(),
    cdi_device_ids: cdi.clone(),
    share_id: d.share_id.clone(),
});

// v1beta1 has no share ids: the device and CDI ids alone.
dra_plugin!(v1beta1, |d, cdi| v1beta1::Device {
    request_names: vec![d.request.clone()],
    pool_name: d.pool.clone(),
    device_name: d.device.clone(),
    cdi_device_ids: cdi.clone(),
});

/// Binds a Unix socket at `path` (its directory made, a stale socket from an earlier run
/// removed), readable by root only.
///
/// # Errors
/// The directory or socket can't be made.
pub fn bind(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(
        path,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
    )?;
    Ok(listener)
}

/// Serves `DRAPlugin` on `plugin` and the registration on `registration` until `shutdown`; the
/// plugin socket is listening before the registration socket appears, so the kubelet finds the
/// endpoint ready. Both sockets are removed at the end (the kubelet then unregisters the
/// plugin).
pub async fn serve(
    driver: Arc<Driver>,
    plugin: tokio::net::UnixListener,
    plugin_path: PathBuf,
    registration: tokio::net::UnixListener,
    registration_path: PathBuf,
    seen: RegistrationSeen,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let plugin_service = tonic::transport::Server::builder()
        .add_service(v1::dra_plugin_server::DraPluginServer::new(Plugin(
            Arc::clone(&driver),
        )))
        .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(Plugin(
            driver,
        )))
        .serve_with_incoming(UnixListenerStream::new(plugin));
    let registration_service = tonic::transport::Server::builder()
        .add_service(reg::registration_server::RegistrationServer::new(
            Registration {
                endpoint: plugin_path.clone(),
                seen,
            },
        ))
        .serve_with_incoming(UnixListenerStream::new(registration));
    tokio::select! {
        r = plugin_service => if let Err(e) = r { tracing::error!("{DRIVER_NAME}: plugin socket: {e}") },
        r = registration_service => if let Err(e) = r { tracing::error!("{DRIVER_NAME}: registration socket: {e}") },
        () = shutdown => {}
    }
    let _ = std::fs::remove_file(&registration_path);
    let _ = std::fs::remove_file(&plugin_path);
}
