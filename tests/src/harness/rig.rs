//! The rig the enforcement tests run on: the fake driver, a controller, and an agent watching
//! the driver's nodes as two mock GPUs and registered with the controller as `test-node`.
//! Sessions are created through the controller, as the admin (the controller is open), owned by
//! `t` and pinned to that node.

use std::{path::PathBuf, time::Duration};

use gpuwarden_agent::config::AgentConfig;
use gpuwarden_agent_api::snapshot::{Container, Snapshot};
use gpuwarden_controller::scheduler::SchedulerConfig;
use gpuwarden_proto::v1::{self as pb, scheduler_service_client::SchedulerServiceClient};
use gpuwarden_test_support::controller::{TestController, fast_timing};
use gpuwarden_test_support::{
    TestCgroup,
    agent::{TestAgent, wait_binding},
    scratch,
    wait::wait_for,
};
use tempfile::TempDir;
use tonic::transport::Channel;

use super::{Driver, mock_gpu_config};

/// A controller, the fake driver, and an agent registered with the controller.
pub struct Rig {
    /// The fake driver.
    pub driver: Driver,
    /// The agent; a test that stops it (to restart it, or to run one of its own) takes it.
    /// Dropped before the controller, so the agent stops first.
    pub agent: Option<TestAgent>,
    /// The controller.
    pub ctl: TestController,
    /// The mock GPU list the agent was given.
    pub mock: PathBuf,
    /// A runtime for the test's client calls.
    pub rt: tokio::runtime::Runtime,
    /// The controller's and the agent's state, removed after both stopped.
    pub state: [TempDir; 2],
}

impl Rig {
    /// Mounts the driver as `tag`, starts the controller and the agent, and waits until the
    /// node is registered. The agent waits a minute for a quota's workload to appear.
    pub fn start(tag: &str) -> Self {
        Self::start_with_binding_timeout(tag, Duration::from_mins(1))
    }

    /// [`Self::start`], with the agent waiting `binding_timeout` for a quota's workload.
    pub fn start_with_binding_timeout(tag: &str, binding_timeout: Duration) -> Self {
        Self::start_with(tag, SchedulerConfig::default(), binding_timeout)
    }

    /// [`Self::start`], the controller scheduling with `config` and the agent waiting
    /// `binding_timeout` for a quota's workload.
    pub fn start_with(tag: &str, config: SchedulerConfig, binding_timeout: Duration) -> Self {
        Self::start_with_agent(tag, config, binding_timeout, |_| {})
    }

    /// [`Self::start_with`], the agent's config changed by `agent` first.
    pub fn start_with_agent(
        tag: &str,
        config: SchedulerConfig,
        binding_timeout: Duration,
        agent: impl FnOnce(&mut AgentConfig),
    ) -> Self {
        let state = [scratch("ctl"), scratch("agent")];
        let ctl = TestController::builder(state[0].path())
            .config(config)
            .timing(timing())
            .start();
        let url = ctl.url();
        Self::around_with(tag, ctl, &url, state, binding_timeout, agent)
    }

    /// Mounts the driver as `tag` and starts an agent given the controllers `urls` (a comma
    /// list: a standby's among them), `ctl` being one of them; waits until the node is
    /// registered. `state` holds the controller's state (if it keeps any there) and the agent's.
    pub fn around(
        tag: &str,
        ctl: TestController,
        urls: &str,
        state: [TempDir; 2],
        binding_timeout: Duration,
    ) -> Self {
        Self::around_with(tag, ctl, urls, state, binding_timeout, |_| {})
    }

    /// [`Self::around`], the agent's config changed by `agent` first.
    pub fn around_with(
        tag: &str,
        ctl: TestController,
        urls: &str,
        state: [TempDir; 2],
        binding_timeout: Duration,
        agent: impl FnOnce(&mut AgentConfig),
    ) -> Self {
        let driver = Driver::mount(tag);
        Self::around_on(driver, None, ctl, urls, state, binding_timeout, agent)
    }

    /// [`Self::start`] on `driver`, the agent given the mock device list `mock` (TOML).
    pub fn start_on(driver: Driver, mock: &str) -> Self {
        Self::start_on_with(driver, mock, |_| {})
    }

    /// [`Self::start_on`], the agent's config changed by `agent` first.
    pub fn start_on_with(driver: Driver, mock: &str, agent: impl FnOnce(&mut AgentConfig)) -> Self {
        let state = [scratch("ctl"), scratch("agent")];
        let ctl = TestController::builder(state[0].path())
            .timing(timing())
            .start();
        let url = ctl.url();
        Self::around_on(
            driver,
            Some(mock),
            ctl,
            &url,
            state,
            Duration::from_mins(1),
            agent,
        )
    }

    fn around_on(
        driver: Driver,
        mock_text: Option<&str>,
        ctl: TestController,
        urls: &str,
        state: [TempDir; 2],
        binding_timeout: Duration,
        agent: impl FnOnce(&mut AgentConfig),
    ) -> Self {
        let mut cfg = mock_gpu_config(&driver, urls.to_owned(), state[1].path());
        let mock = cfg.mock_devices.clone().unwrap();
        if let Some(text) = mock_text {
            std::fs::write(&mock, text).unwrap();
        }
        cfg.binding_timeout = binding_timeout;
        agent(&mut cfg);
        let agent = TestAgent::start_with(cfg);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let rig = Self {
            driver,
            agent: Some(agent),
            ctl,
            mock,
            rt,
            state,
        };
        rig.wait_for("the node to register", |r| {
            r.rt.block_on(async {
                let mut c = r.client().await;
                c.list_nodes(pb::ListNodesRequest::default())
                    .await
                    .is_ok_and(|n| n.into_inner().nodes.len() == 1)
            })
        });
        rig
    }

    /// The agent, while it runs.
    pub fn agent(&self) -> &TestAgent {
        self.agent.as_ref().unwrap()
    }

    /// A scheduler client of the controller.
    pub async fn client(&self) -> SchedulerServiceClient<Channel> {
        self.ctl.client().await
    }

    /// Creates a session of `t` on `test-node` and returns it at once.
    pub fn create(&self, request: pb::CreateSessionRequest) -> pb::Session {
        self.rt.block_on(async {
            let mut c = self.client().await;
            c.create_session(pb::CreateSessionRequest {
                node_id: "test-node".into(),
                owner: "t".into(),
                ..request
            })
            .await
            .unwrap()
            .into_inner()
        })
    }

    /// Creates a session of `slots` for `target`, with the memory policy `memory`, and waits
    /// until it runs (the agent took its quota).
    pub fn session(&self, slots: &[&str], target: pb::target::Kind, memory: &str) -> pb::Session {
        let session = self.create(session_request(slots, target, memory));
        self.wait_for("the session to run", |r| {
            r.get(&session.id).state == pb::SessionState::Running as i32
        });
        self.get(&session.id)
    }

    /// The session `id` as the controller has it now.
    pub fn get(&self, id: &str) -> pb::Session {
        self.rt.block_on(async {
            let mut c = self.client().await;
            c.get_session(pb::GetSessionRequest { id: id.into() })
                .await
                .unwrap()
                .into_inner()
        })
    }

    /// Every session as the controller lists it now.
    pub fn sessions(&self) -> Vec<pb::Session> {
        self.rt.block_on(async {
            let mut c = self.client().await;
            c.list_sessions(pb::ListSessionsRequest::default())
                .await
                .unwrap()
                .into_inner()
                .sessions
        })
    }

    /// The nodes as the controller lists them now.
    pub fn nodes(&self) -> Vec<pb::Node> {
        self.rt.block_on(async {
            let mut c = self.client().await;
            c.list_nodes(pb::ListNodesRequest::default())
                .await
                .unwrap()
                .into_inner()
                .nodes
        })
    }

    /// Waits until `session` failed with a reason that holds `words`.
    pub fn wait_failed(&self, session: &str, words: &str) -> pb::Session {
        self.wait_for(&format!("{session} to fail with {words:?}"), |r| {
            let s = r.get(session);
            s.state == pb::SessionState::Failed as i32 && s.reason.contains(words)
        });
        self.get(session)
    }

    /// Waits until the snapshot shows `session` in binding `state`; that snapshot.
    pub fn wait_binding(&self, session: &str, state: &str) -> Snapshot {
        wait_binding(self.agent(), session, state)
    }

    /// Waits until `check` holds of the rig ([`wait_for`]).
    pub fn wait_for(&self, what: &str, mut check: impl FnMut(&Self) -> bool) {
        wait_for(what, || check(self));
    }

    /// The snapshot's entry of the container `cg`.
    pub fn entry(&self, cg: &TestCgroup) -> Container {
        self.agent()
            .container(&cg.path)
            .unwrap_or_else(|| panic!("{} not in the snapshot", cg.path))
    }
}

/// The rig controller's heartbeats and passes: a node is lost after 5 s of silence.
pub fn timing() -> gpuwarden_controller::api::Timing {
    fast_timing(Duration::from_secs(5))
}

/// A request for a session of `slots` (`name=value`) for `target`, with the memory policy
/// `memory`.
pub fn session_request(
    slots: &[&str],
    target: pb::target::Kind,
    memory: &str,
) -> pb::CreateSessionRequest {
    let requested = gpuwarden_controller::slots::ResourceSlot::parse_any(slots).unwrap();
    pb::CreateSessionRequest {
        requested: Some(gpuwarden_controller::api::convert::slots_to_pb(&requested)),
        target: Some(pb::Target { kind: Some(target) }),
        policy: Some(pb::QuotaPolicy {
            memory: memory.into(),
            compute: String::new(),
            ..Default::default()
        }),
        ..Default::default()
    }
}
