//! `gpuwarden-controller run`: the app. It opens the store (or campaigns on it), binds every
//! port, starts every task — the gRPC server with the controller's background loop and
//! election, the webhook, the extender, the metrics — and joins them all: one stop (SIGINT,
//! SIGTERM, or the gRPC server ending) reaches each, and none is left running.

use std::{
    future::Future,
    net::{Ipv4Addr, SocketAddr},
    path::Path,
    process::ExitCode,
    sync::Arc,
    time::Duration,
};

use tokio::sync::watch;

use crate::{
    controller::{Controller, Timing},
    limits::Bounds,
    scheduler::{Scheduler, SchedulerConfig},
    store::{Store, StoreSpec},
};

use super::{
    ServeError,
    config::{self, RunArgs, RunConfig},
    election, grpc,
};

/// Opens the store `spec` names, rebuilds the state from it, and returns the controller.
///
/// # Errors
/// The store can't be opened, reached or read.
pub async fn open(
    spec: &StoreSpec,
    config: SchedulerConfig,
    timing: Timing,
) -> Result<Arc<Controller>, ServeError> {
    let store = Store::open(spec).await?;
    let snapshot = store.load().await?;
    tracing::info!(
        sessions = snapshot.sessions.len(),
        nodes = snapshot.nodes.len(),
        profiles = snapshot.profiles.len(),
        "state restored from {spec}"
    );
    let scheduler = Scheduler::restore(config, snapshot);
    Ok(Controller::new(scheduler, store, timing))
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
        .and_then(|runtime| runtime.block_on(run(config, gpuwarden_runtime::shutdown())));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuwarden-controller: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Starts every task of the controller `config` describes, runs them until `stop` completes or
/// the gRPC server ends, then stops and joins them all.
///
/// # Errors
/// A port can't be bound, the store can't be used, or a task failed.
async fn run(config: RunConfig, stop: impl Future<Output = ()>) -> Result<(), ServeError> {
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
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: listen,
            source,
        })?;
    let bound = listener.local_addr().map_err(ServeError::LocalAddr)?;
    let (controller, election) = if matches!(store, StoreSpec::Etcd { .. }) {
        let advertise = advertise.unwrap_or_else(|| config::advertised(bound));
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
    // One stop for every task, set once.
    let (stopping, stopped) = watch::channel(false);
    let stopped = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }
    };
    // One set of bounds for every part that refuses: the gRPC services and their connection
    // caps, the webhook and the extender; the metrics read what it counted.
    let bounds = Bounds::new(limits);
    let tasks = match kube {
        Some(kube) => kube.spawn(&controller, &bounds, &stopped),
        None => Vec::new(),
    };
    // Metrics are an extra: a bad endpoint is reported, never fatal.
    let _metrics = match crate::metrics::start(&controller, &bounds, &exporters) {
        Ok(metrics) => metrics,
        Err(e) => {
            tracing::warn!("metrics off: {e}");
            None
        }
    };
    let mut grpc_task = tokio::spawn(grpc::serve_bounded(
        controller,
        listener,
        security,
        bounds,
        election,
        stopped(),
    ));
    let served = tokio::select! {
        () = stop => {
            let _ = stopping.send(true);
            joined("gRPC server", (&mut grpc_task).await)
        }
        served = &mut grpc_task => joined("gRPC server", served),
    };
    let _ = stopping.send(true);
    let mut result = served;
    for (task, handle) in tasks {
        let ended = handle
            .await
            .map_err(|source| ServeError::Task { task, source });
        result = result.and(ended);
    }
    result
}

/// What a joined task returned, or why it did not return.
fn joined(
    task: &'static str,
    ended: Result<Result<(), ServeError>, tokio::task::JoinError>,
) -> Result<(), ServeError> {
    ended.map_err(|source| ServeError::Task { task, source })?
}

/// Binds a loopback port and serves, in a task of the current runtime, a controller campaigning
/// on the etcd store `spec` with a lease of `ttl`, held to `bounds` and advertising that port,
/// until `shutdown`; its address. Tests and benchmarks run several controllers in one process
/// this way.
///
/// # Errors
/// The port can't be bound, or the store can't be reached.
pub async fn spawn_elected(
    spec: &StoreSpec,
    config: SchedulerConfig,
    timing: Timing,
    ttl: Duration,
    bounds: Arc<Bounds>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<SocketAddr, ServeError> {
    let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let listener = tokio::net::TcpListener::bind(any)
        .await
        .map_err(|source| ServeError::Bind { addr: any, source })?;
    let addr = listener.local_addr().map_err(ServeError::LocalAddr)?;
    let (controller, election) =
        election::open_standby(spec, config, timing, addr.to_string(), ttl).await?;
    tokio::spawn(grpc::serve_bounded(
        controller,
        listener,
        super::security::Transport::PlainText,
        bounds,
        Some(election),
        shutdown,
    ));
    Ok(addr)
}
