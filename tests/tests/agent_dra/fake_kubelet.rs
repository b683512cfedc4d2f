//! A fake kubelet built from the vendored kubelet protos: it watches the plugin registry
//! directory as the kubelet's plugin watcher does, registers the plugin it finds through
//! `pluginregistration.Registration`, and calls `DRAPlugin` (v1 or v1beta1) on the endpoint the
//! plugin named, all over the Unix sockets.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use gpuwarden_proto::kubelet::{dra_v1 as v1, dra_v1beta1 as v1beta1, pluginregistration as reg};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// A gRPC channel over the Unix socket at `path`.
pub async fn unix_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_owned();
    // The URI is required but unused: the connector dials the socket.
    Endpoint::try_from("http://[::1]:50051")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
}

/// Waits for a `*-reg.sock` in `dir` that answers `GetInfo`, as the plugin watcher does.
pub async fn discover(dir: &Path) -> (PathBuf, reg::PluginInfo) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let sockets: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.to_string_lossy().ends_with("-reg.sock"))
                    .collect()
            })
            .unwrap_or_default();
        for socket in sockets {
            if let Ok(channel) = unix_channel(&socket).await {
                let mut client = reg::registration_client::RegistrationClient::new(channel);
                if let Ok(info) = client.get_info(reg::InfoRequest {}).await {
                    return (socket, info.into_inner());
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no plugin registered in {}",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Tells the plugin at `socket` how its registration went.
pub async fn notify(socket: &Path, registered: bool, error: &str) {
    let mut client =
        reg::registration_client::RegistrationClient::new(unix_channel(socket).await.unwrap());
    client
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: registered,
            error: error.to_owned(),
        })
        .await
        .unwrap();
}

/// `(namespace, uid, name)` of a claim.
pub type ClaimId<'a> = (&'a str, &'a str, &'a str);

/// `NodePrepareResources`, v1.
pub async fn prepare_v1(
    endpoint: &Path,
    claims: &[ClaimId<'_>],
) -> v1::NodePrepareResourcesResponse {
    let mut c = v1::dra_plugin_client::DraPluginClient::new(unix_channel(endpoint).await.unwrap());
    c.node_prepare_resources(v1::NodePrepareResourcesRequest {
        claims: claims
            .iter()
            .map(|(namespace, uid, name)| v1::Claim {
                namespace: (*namespace).into(),
                uid: (*uid).into(),
                name: (*name).into(),
            })
            .collect(),
    })
    .await
    .unwrap()
    .into_inner()
}

/// `NodeUnprepareResources`, v1.
pub async fn unprepare_v1(
    endpoint: &Path,
    claims: &[ClaimId<'_>],
) -> v1::NodeUnprepareResourcesResponse {
    let mut c = v1::dra_plugin_client::DraPluginClient::new(unix_channel(endpoint).await.unwrap());
    c.node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
        claims: claims
            .iter()
            .map(|(namespace, uid, name)| v1::Claim {
                namespace: (*namespace).into(),
                uid: (*uid).into(),
                name: (*name).into(),
            })
            .collect(),
    })
    .await
    .unwrap()
    .into_inner()
}

/// `NodePrepareResources`, v1beta1.
pub async fn prepare_v1beta1(
    endpoint: &Path,
    claims: &[ClaimId<'_>],
) -> v1beta1::NodePrepareResourcesResponse {
    let mut c =
        v1beta1::dra_plugin_client::DraPluginClient::new(unix_channel(endpoint).await.unwrap());
    c.node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
        claims: claims
            .iter()
            .map(|(namespace, uid, name)| v1beta1::Claim {
                namespace: (*namespace).into(),
                uid: (*uid).into(),
                name: (*name).into(),
            })
            .collect(),
    })
    .await
    .unwrap()
    .into_inner()
}

/// `NodeUnprepareResources`, v1beta1.
pub async fn unprepare_v1beta1(
    endpoint: &Path,
    claims: &[ClaimId<'_>],
) -> v1beta1::NodeUnprepareResourcesResponse {
    let mut c =
        v1beta1::dra_plugin_client::DraPluginClient::new(unix_channel(endpoint).await.unwrap());
    c.node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest {
        claims: claims
            .iter()
            .map(|(namespace, uid, name)| v1beta1::Claim {
                namespace: (*namespace).into(),
                uid: (*uid).into(),
                name: (*name).into(),
            })
            .collect(),
    })
    .await
    .unwrap()
    .into_inner()
}
