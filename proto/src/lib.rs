//! gpuwarden's gRPC API, package `gpuwarden.v1`, generated from `proto/gpuwarden/v1/*.proto`
//! with a pure-Rust protobuf compiler.
//!
//! - `AgentService`: an agent registers its node (devices, slot types, hooks) and then keeps one
//!   bidirectional stream: heartbeats and allocation acks up, `Allocate`/`Release` down.
//! - `SchedulerService`: clients create, watch and terminate sessions, and read nodes, the
//!   per-device allocation map and the merged slot types.
//!
//! Slot values travel as exact decimal strings so fractions stay exact end to end.
//!
//! [`kubelet`] holds the kubelet's plugin APIs (plugin registration and DRA), compiled from the
//! `.proto` files vendored from kubernetes/kubelet (`vendor/kubelet/README.md`).
//!
//! [`convert`] maps the messages to and from the shared domain types (`gpuwarden-types`);
//! [`follow`] is how agents and clients find the leader among several controllers.

pub mod convert;
pub mod follow;

/// The `gpuwarden.v1` package.
#[allow(missing_docs, clippy::pedantic, clippy::all)]
pub mod v1 {
    tonic::include_proto!("gpuwarden.v1");

    /// Encoded file descriptors of the package, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("gpuwarden_descriptor");
}

/// The kubelet's plugin APIs, generated from the `.proto` files vendored from kubernetes/kubelet
/// (`vendor/kubelet/`, Apache-2.0; the tag is in its README): what a DRA driver serves to the
/// kubelet.
pub mod kubelet {
    /// `pluginregistration` (`pkg/apis/pluginregistration/v1`): the service a plugin serves on
    /// its socket under the kubelet's `plugins_registry`, so the kubelet's plugin watcher finds
    /// it.
    #[allow(missing_docs, clippy::pedantic, clippy::all)]
    pub mod pluginregistration {
        tonic::include_proto!("pluginregistration");
    }

    /// `k8s.io.kubelet.pkg.apis.dra.v1`: `DRAPlugin` (`NodePrepareResources`,
    /// `NodeUnprepareResources`), version `v1.DRAPlugin`.
    #[allow(missing_docs, clippy::pedantic, clippy::all)]
    pub mod dra_v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }

    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1`: the same service as [`dra_v1`] without share ids,
    /// version `v1beta1.DRAPlugin`.
    #[allow(missing_docs, clippy::pedantic, clippy::all)]
    pub mod dra_v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }

    /// The plugin type a DRA driver registers as (`PluginInfo.type`).
    pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
    /// The versions of `DRAPlugin` served (`PluginInfo.supported_versions`).
    pub const DRA_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];
}
