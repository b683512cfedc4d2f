//! Leader election among controllers sharing an etcd store (docs/architecture.md, "One machine
//! embeds, many use etcd"): the loop over the store's leadership ([`crate::store::Office`]:
//! campaign, office, fence) that makes this controller lead while it holds office and stand by
//! otherwise.

use std::{sync::Arc, time::Duration};

use crate::{
    hub::{Hub, Role, Timing},
    scheduler::{Scheduler, SchedulerConfig},
    store::{EtcdKv, Kv, Replica, Snapshot, Store, StoreSpec},
};

use super::ServeError;
use crate::api::{AgentApi, SchedulerApi};
use gpuwarden_proto::v1::{
    agent_service_server::AgentServiceServer, scheduler_service_server::SchedulerServiceServer,
};

/// The election name controllers sharing a store campaign on.
pub const ELECTION: &str = "controller";

/// How a controller that shares an etcd store campaigns.
#[derive(Debug, Clone)]
pub struct Election {
    /// The store's etcd.
    pub kv: EtcdKv,
    /// The address agents and clients reach this controller at, told to them by standbys.
    pub advertise: String,
    /// The lease: a leader that stops renewing it loses office this long after.
    pub ttl: Duration,
}

/// A standby controller on the etcd store `spec` names: it leads once it wins the election.
///
/// # Errors
/// The store can't be reached, or has another format version.
pub async fn open_standby(
    spec: &StoreSpec,
    config: SchedulerConfig,
    timing: Timing,
    advertise: String,
    ttl: Duration,
) -> Result<(Arc<Hub>, Election), ServeError> {
    let store = Store::open(spec).await?;
    let Kv::Etcd(kv) = store.kv() else {
        return Err(ServeError::NotEtcd {
            spec: spec.to_string(),
        });
    };
    let election = Election {
        kv: (**kv).clone(),
        advertise,
        ttl,
    };
    tracing::info!(store = %spec, ttl = ?ttl, "standby: campaigning for leadership");
    let controller = Hub::with_role(Scheduler::new(config), store, timing, Role::standby());
    Ok((controller, election))
}

/// Campaigns, leads while the office holds, steps down when it lapses or a commit is refused,
/// and campaigns again, for as long as the server runs. While campaigning it learns where the
/// leader is, for the standby's answers.
pub(super) async fn hold_elections(
    controller: Arc<Hub>,
    election: Election,
    health: tonic_health::server::HealthReporter,
) {
    let Election { kv, advertise, ttl } = election;
    // A standby keeps a warm copy of the state, so that taking office reads nothing; one that
    // stopped following (etcd restarted, say) is made again.
    let mut replica: Option<Replica> = None;
    loop {
        if replica.as_ref().is_none_or(Replica::failed) {
            replica = match kv.replicate().await {
                Ok(replica) => Some(replica),
                Err(e) => {
                    tracing::warn!(
                        "standby without a warm copy (takeover will read the store): {e}"
                    );
                    None
                }
            };
        }
        let campaign = kv.campaign(ELECTION, &advertise, ttl);
        tokio::pin!(campaign);
        let won = loop {
            tokio::select! {
                won = &mut campaign => break won,
                () = tokio::time::sleep(Duration::from_millis(250)) => {
                    match kv.leader(ELECTION).await {
                        Ok(leader) => controller.role().stand_by(leader),
                        Err(e) => tracing::warn!("standby: cannot learn the leader: {e}"),
                    }
                }
            }
        };
        let office = match won {
            Ok(office) => office,
            Err(e) => {
                tracing::error!("not scheduling: cannot campaign for leadership: {e}; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let store = match Store::over(Kv::Etcd(Box::new(kv.clone()))).await {
            Ok(store) => store.fenced(office.fence()),
            Err(e) => {
                tracing::error!("won the election but cannot use the store: {e}; resigning");
                let _ = office.resign().await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let loading = std::time::Instant::now();
        let warm = match &replica {
            Some(replica) => match replica.caught_up(office.won_at(), ttl).await {
                Ok(()) => Snapshot::from_records(replica.records()).ok(),
                Err(e) => {
                    tracing::warn!("the warm copy is behind ({e}); reading the store instead");
                    None
                }
            },
            None => None,
        };
        let from_copy = warm.is_some();
        let stored = match warm {
            Some(stored) => stored,
            None => match store.load().await {
                Ok(stored) => stored,
                Err(e) => {
                    tracing::error!("won the election but cannot read the state: {e}; resigning");
                    let _ = office.resign().await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
        };
        tracing::info!(
            sessions = stored.sessions.len(),
            nodes = stored.nodes.len(),
            term = controller.role().terms() + 1,
            took = ?loading.elapsed(),
            from = if from_copy { "the warm copy" } else { "the store" },
            "leading: took office at {advertise}"
        );
        controller.take_office(store, stored);
        set_health(&health, true).await;
        loop {
            tokio::select! {
                () = controller.deposed() => {
                    tracing::error!("stepping down: a commit was refused, another controller leads");
                    break;
                }
                () = tokio::time::sleep(ttl / 4) => {
                    if !office.renewing() {
                        tracing::error!("stepping down: the leadership lease could not be renewed");
                        break;
                    }
                }
            }
        }
        controller.step_down(None);
        set_health(&health, false).await;
        drop(office);
    }
}

/// Marks the services serving or not, as this controller leads or stands by.
pub(super) async fn set_health(reporter: &tonic_health::server::HealthReporter, leading: bool) {
    let status = if leading {
        tonic_health::ServingStatus::Serving
    } else {
        tonic_health::ServingStatus::NotServing
    };
    reporter
        .set_service_status(
            <SchedulerServiceServer<SchedulerApi> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
    reporter
        .set_service_status(
            <AgentServiceServer<AgentApi> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
}
