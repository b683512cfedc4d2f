//! `gpuwarden-controller run`: the app, in the lifecycle both daemons share
//! (docs/architecture.md, "Lifecycle"): a [`RunConfig`] is built into an [`App`] (every port
//! bound, the store opened or a campaign on it readied), the app is spawned into [`Running`]
//! tasks — the webhook, the extender, the metrics, the gRPC server with the controller's
//! background loop and election — and shutting down stops and joins them in reverse start order:
//! one stop (SIGINT, SIGTERM, or the gRPC server ending) reaches each, and none is left running.

use std::{future::Future, net::SocketAddr, path::Path, process::ExitCode, sync::Arc};

use gpuwarden_runtime::{
    lifecycle::{Stop, Tasks},
    otlp::Exporters,
};
use tokio::net::TcpListener;

use crate::{
    hub::{Hub, Timing},
    limits::Bounds,
    metrics::FollowedFiles,
    scheduler::{Scheduler, SchedulerConfig},
    store::{Store, StoreSpec},
};

use super::{
    ServeError,
    config::{self, RunArgs, RunConfig},
    election::{self, Election},
    grpc::GrpcServer,
    kube::KubeListeners,
    security::Security,
};

/// Opens the store `spec` names, rebuilds the state from it, and returns the controller.
///
/// # Errors
/// The store can't be opened, reached or read.
pub async fn open(
    spec: &StoreSpec,
    config: SchedulerConfig,
    timing: Timing,
) -> Result<Arc<Hub>, ServeError> {
    let store = Store::open(spec).await?;
    let snapshot = store.load().await?;
    tracing::info!(
        sessions = snapshot.sessions.len(),
        nodes = snapshot.nodes.len(),
        profiles = snapshot.profiles.len(),
        "state restored from {spec}"
    );
    let scheduler = Scheduler::restore(config, snapshot);
    Ok(Hub::new(scheduler, store, timing))
}

/// The store of a state directory: sled in its `store/` folder ([`StoreSpec::sled_in`]).
#[must_use]
pub fn sled_in(state_dir: &Path) -> StoreSpec {
    StoreSpec::sled_in(state_dir)
}

/// `run`: serves until SIGINT or SIGTERM on a runtime of its own. Exits 2 for a bad
/// configuration (as for a bad flag), 1 when starting or serving fails.
pub(super) fn main(args: RunArgs) -> ExitCode {
    let config = match args.resolve() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("gpuwarden-controller: {e}");
            return ExitCode::from(2);
        }
    };
    let served = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)
        .and_then(|runtime| runtime.block_on(run_until(config, gpuwarden_runtime::shutdown())));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuwarden-controller: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The whole lifecycle: builds the controller `config` describes, spawns it, and runs it until
/// `stop` completes or the gRPC server ends, then shuts it down.
///
/// # Errors
/// Building failed (see [`App::build`]), or a task failed.
pub async fn run_until(
    config: RunConfig,
    stop: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    App::build(config).await?.spawn().run_until(stop).await
}

/// A controller built from its [`RunConfig`]: every port bound and the store opened (or, on
/// etcd, a standby ready to campaign); nothing runs until [`App::spawn`].
#[must_use = "an app does nothing until spawned"]
pub struct App {
    controller: Arc<Hub>,
    election: Option<Election>,
    listener: TcpListener,
    addr: SocketAddr,
    kube: Option<KubeListeners>,
    security: Security,
    bounds: Arc<Bounds>,
    exporters: Exporters,
}

impl App {
    /// Binds the Kubernetes ports and the gRPC port, then opens the store: made private and
    /// restored on sled, a standby campaigning on etcd (advertising the bound address unless
    /// `advertise` says otherwise).
    ///
    /// # Errors
    /// [`ServeError::Kubernetes`] or [`ServeError::Bind`] naming the port, [`ServeError::Store`]
    /// or [`ServeError::PrivateState`] for the store, [`ServeError::NotEtcd`].
    pub async fn build(config: RunConfig) -> Result<Self, ServeError> {
        let RunConfig {
            listen,
            store,
            advertise,
            lease_ttl,
            security,
            limits,
            scheduler,
            timing,
            exporters,
            kube,
        } = config;
        tracing::info!(placement = %scheduler.strategy, "default placement mode");
        // Bound before the store is opened: a port in use stops the start at once, and the
        // address a standby advertises is the one bound (`--listen` with port 0 included).
        let kube = kube.bind().await?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| ServeError::Bind {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(ServeError::LocalAddr)?;
        let (controller, election) = if matches!(store, StoreSpec::Etcd { .. }) {
            let advertise = advertise.unwrap_or_else(|| config::advertised(addr));
            let (controller, election) =
                election::open_standby(&store, scheduler, timing, advertise, lease_ttl).await?;
            (controller, Some(election))
        } else {
            // What the controller stores (owners, targets, pod UIDs) is its own: the folder is
            // made 0700 before sled writes in it, and what sled made under the umask 0600 after.
            let private = |store: &StoreSpec| match store {
                StoreSpec::Sled(dir) => gpuwarden_runtime::private::make_private(dir).map(|_| ()),
                StoreSpec::Etcd { .. } => Ok(()),
            };
            private(&store)?;
            let controller = open(&store, scheduler, timing).await?;
            private(&store)?;
            (controller, None)
        };
        Ok(Self {
            controller,
            election,
            listener,
            addr,
            kube,
            security,
            // One set of bounds for every part that refuses: the gRPC services and their
            // connection caps, the webhook and the extender; the metrics read what it counted.
            bounds: Bounds::new(limits),
            exporters,
        })
    }

    /// Where the gRPC port is bound.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The controller it serves.
    #[must_use]
    pub fn controller(&self) -> &Arc<Hub> {
        &self.controller
    }

    /// The bounds every part is held to, which count what they refuse.
    #[must_use]
    pub fn bounds(&self) -> &Arc<Bounds> {
        &self.bounds
    }

    /// Starts every task on the current runtime, in this order: the webhook and the extender,
    /// the metrics, the gRPC server (with the controller's background loop and its campaign).
    /// A gRPC server that ends by itself stops the others.
    pub fn spawn(self) -> Running {
        let stop = Stop::default();
        let mut tasks = Tasks::default();
        if let Some(kube) = self.kube {
            kube.spawn(&self.controller, &self.bounds, &stop, &mut tasks);
        }
        // Metrics are an extra: a bad endpoint is reported, never fatal.
        let files = FollowedFiles {
            tokens: self.security.tokens.clone(),
            grants: Arc::clone(&self.security.grants),
        };
        match crate::metrics::start(&self.controller, &self.bounds, &files, &self.exporters) {
            // The pipeline's callbacks hold the controller: let go of with the tasks.
            Ok(Some(metrics)) => tasks.stop_by("metrics", move || async move {
                drop(metrics);
                Ok(())
            }),
            Ok(None) => {}
            Err(e) => tracing::warn!("metrics off: {e}"),
        }
        let grpc_server = GrpcServer::new(self.controller, self.listener)
            .security(self.security)
            .bounds(self.bounds)
            .election(self.election);
        let stopped = stop.stopped();
        let ended = stop.clone();
        let grpc = tokio::spawn(async move {
            let result = Box::pin(grpc_server.serve(stopped)).await;
            ended.stop();
            result
        });
        let told = stop.clone();
        tasks.stop_with("gRPC server", grpc, move || told.stop());
        Running {
            addr: self.addr,
            stop,
            tasks,
        }
    }
}

/// A spawned controller: its tasks, in start order, and the one stop they share. Dropped, it
/// lets go of that stop, which the tasks take as one, unjoined: shut it down instead.
#[must_use = "dropping it stops the tasks without joining them; shut it down"]
pub struct Running {
    addr: SocketAddr,
    stop: Stop,
    tasks: Tasks<ServeError>,
}

impl Running {
    /// Where the gRPC port is bound.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Runs until `stop` completes or the gRPC server ends by itself, then shuts down.
    ///
    /// # Errors
    /// See [`Running::shutdown`].
    pub async fn run_until(self, stop: impl Future<Output = ()>) -> Result<(), ServeError> {
        tokio::select! {
            () = stop => {}
            () = self.stop.stopped() => {}
        }
        self.shutdown().await
    }

    /// Stops every task and joins them, the last started first: the gRPC server (which drains
    /// its connections and joins the background loop and the campaign), the metrics, the
    /// extender, the webhook.
    ///
    /// # Errors
    /// The gRPC server failed, or a task panicked.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        self.stop.stop();
        self.tasks.shutdown().await
    }
}
