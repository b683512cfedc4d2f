use std::collections::BTreeSet;

use super::{
    allocation::known_slots,
    commands::{interrupted_moves, resume_command},
    *,
};
use crate::checkpoint::GpuPair;
use crate::{control::holdings::Holdings, devices::NoGpus};

#[test]
fn unknown_slots_are_refused_unless_zero() {
    let known: BTreeSet<String> = ["cpu", "cuda.shares"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let alloc = |pairs: &[(&str, &str)]| pb::Allocate {
        session_id: "s".into(),
        slots: Some(pb::ResourceSlot {
            values: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }),
        ..Default::default()
    };
    assert!(check_allocation(&known, &alloc(&[("cpu", "1"), ("cuda.shares", "0.5")])).is_none());
    assert!(check_allocation(&known, &alloc(&[("mock.accel", "0")])).is_none());
    let nack = check_allocation(&known, &alloc(&[("mock.accel", "0.5")])).unwrap();
    assert_eq!(nack.reason, "UnsupportedResource");
    assert!(nack.message.contains("mock.accel"), "{}", nack.message);
}

#[test]
fn an_invalid_url_is_a_fatal_error_naming_it() {
    let err = check_url("not a url").unwrap_err();
    assert!(err.is_fatal(), "{err}");
    assert!(matches!(err, LinkError::InvalidUrl { .. }), "{err}");
    assert!(err.to_string().contains("\"not a url\""), "{err}");
    assert!(check_url("http://127.0.0.1:50051").is_ok());
}

fn link_to(url: &str) -> (LinkConfig, SharedHoldings, tempfile::TempDir) {
    let dir = gpuwarden_test_support::scratch("link");
    let holdings = Holdings::open(&dir.path().join("store")).unwrap();
    let config = LinkConfig {
        controller: url.to_owned(),
        tls: ClientTls::default(),
        node_id: "n".into(),
        hostname: "n".into(),
        hooks: vec![],
        mig_reconfigurable: vec![],
    };
    (config, Arc::new(std::sync::Mutex::new(holdings)), dir)
}

#[tokio::test]
async fn the_link_stops_at_once_on_an_invalid_url() {
    let (config, holdings, _dir) = link_to("not a url");
    let backend: Arc<dyn GpuBackend> = Arc::new(NoGpus);
    tokio::time::timeout(
        Duration::from_secs(5),
        run(config, backend, holdings, None, std::future::pending()),
    )
    .await
    .expect("an invalid URL is not retried");
}

#[tokio::test]
async fn an_unreachable_controller_is_retried_until_shutdown() {
    // A port nobody listens on: bind, note it, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let (config, holdings, _dir) = link_to(&url);
    let backend: Arc<dyn GpuBackend> = Arc::new(NoGpus);
    let none = crate::devices::ondemand::Reconfigurer::default();
    let err = connect_once(&url, &config, backend.as_ref(), &holdings, None, &none)
        .await
        .unwrap_err();
    assert!(matches!(err, LinkError::Connect(_)), "{err}");
    assert!(!err.is_fatal());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let link = tokio::spawn(run(config, backend, holdings, None, async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!link.is_finished(), "a refused connection is retried");
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), link)
        .await
        .expect("stops on shutdown")
        .unwrap();
}

#[test]
fn the_backoff_doubles_up_to_five_seconds_and_resets() {
    let mut b = Backoff::default();
    let delays: Vec<u64> = (0..8)
        .map(|_| u64::try_from(b.next_delay().as_millis()).unwrap())
        .collect();
    assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    b.reset();
    assert_eq!(b.current(), Duration::from_millis(100));
}

/// A CA and a node certificate for `node`, as PEM files in `dir`.
fn mint(dir: &std::path::Path, node: &str) -> ClientTls {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::default();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![rcgen::SanType::URI(
        format!("spiffe://gpuwarden/node/{node}")
            .try_into()
            .unwrap(),
    )];
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("node.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("node.key"), key.serialize_pem()).unwrap();
    ClientTls {
        ca: Some(dir.join("ca.pem")),
        cert: Some(dir.join("node.pem")),
        key: Some(dir.join("node.key")),
    }
}

#[test]
fn tls_files_are_read_at_each_connection_and_a_missing_one_is_fatal() {
    let dir = gpuwarden_test_support::scratch("link-tls");
    let tls = mint(dir.path(), "n");
    assert!(endpoint("https://127.0.0.1:50051", &tls).is_ok());

    // Rotated away without a replacement: the next connection names the file and gives up.
    std::fs::remove_file(dir.path().join("node.key")).unwrap();
    let err = endpoint("https://127.0.0.1:50051", &tls).unwrap_err();
    assert!(matches!(err, LinkError::Tls(_)), "{err}");
    assert!(err.is_fatal());
    assert!(err.to_string().contains("node.key"), "{err}");

    // TLS files with a plain-text URL would go unused: refused, not ignored.
    let err = endpoint("http://127.0.0.1:50051", &mint(dir.path(), "n")).unwrap_err();
    assert!(matches!(err, LinkError::Tls(_)), "{err}");
}

#[tokio::test]
async fn the_link_stops_at_once_on_a_missing_certificate() {
    let (mut config, holdings, dir) = link_to("https://127.0.0.1:50051");
    config.tls = ClientTls {
        ca: Some(dir.path().join("absent-ca.pem")),
        ..ClientTls::default()
    };
    let backend: Arc<dyn GpuBackend> = Arc::new(NoGpus);
    tokio::time::timeout(
        Duration::from_secs(5),
        run(config, backend, holdings, None, std::future::pending()),
    )
    .await
    .expect("a missing TLS file is not retried");
}

#[test]
fn a_release_without_enforcement_lets_go_at_once_and_says_released() {
    let (config, holdings, _dir) = link_to("http://127.0.0.1:1");
    let held = pb::Allocate {
        session_id: "s-1".into(),
        ..pb::Allocate::default()
    };
    lock(&holdings).hold(held).unwrap();
    let release = pb::Release {
        session_id: "s-1".into(),
    };
    let reply = answer(
        &config,
        &NoGpus,
        &holdings,
        None,
        Some(Msg::Release(release)),
    );
    let Some(pb::agent_message::Msg::Event(event)) = reply else {
        panic!("{reply:?}");
    };
    // Both names of the action: the string for controllers from before the enum.
    assert_eq!(
        (event.session_id.as_str(), event.action.as_str()),
        ("s-1", "released")
    );
    assert_eq!(event.action_kind(), pb::EnforcementAction::Released);
    assert!(lock(&holdings).sessions().is_empty());
}

#[test]
fn a_preemption_without_enforcement_lets_go_at_once_and_says_preempted() {
    let (config, holdings, _dir) = link_to("http://127.0.0.1:1");
    let held = pb::Allocate {
        session_id: "s-1".into(),
        ..pb::Allocate::default()
    };
    lock(&holdings).hold(held).unwrap();
    let reply = answer(
        &config,
        &NoGpus,
        &holdings,
        None,
        Some(Msg::Preempt(pb::Preempt {
            session_id: "s-1".into(),
            grace_ms: 30_000,
            reason: "for s-2".into(),
            mode: "suspend".into(),
        })),
    );
    let Some(pb::agent_message::Msg::Event(event)) = reply else {
        panic!("{reply:?}");
    };
    assert_eq!(
        (event.session_id.as_str(), event.action.as_str()),
        ("s-1", "preempted")
    );
    assert_eq!(event.action_kind(), pb::EnforcementAction::Preempted);
    assert!(lock(&holdings).sessions().is_empty());
    // A malformed id is ignored.
    let reply = answer(
        &config,
        &NoGpus,
        &holdings,
        None,
        Some(Msg::Preempt(pb::Preempt {
            session_id: "../x".into(),
            ..pb::Preempt::default()
        })),
    );
    assert!(reply.is_none());
}

#[test]
fn each_mig_profile_registers_as_a_slot_type_with_its_instance_count() {
    let (config, _holdings, _dir) = link_to("http://127.0.0.1:1");
    let backend = crate::devices::mock::MockBackend::from_toml(
        include_str!("../../../../deploy/mock-devices-mig.toml"),
        std::path::Path::new("mock-devices-mig.toml"),
    )
    .unwrap();
    let info = node_info(&config, &backend, vec![], None);
    let types: Vec<&str> = info.slot_types.iter().map(|t| t.name.as_str()).collect();
    for name in [
        "cuda.shares",
        "cuda.mig.1g.18gb",
        "cuda.mig.2g.35gb",
        "cuda.mig.3g.71gb",
    ] {
        assert!(types.contains(&name), "{name} in {types:?}");
    }
    let capacity = info.capacity.unwrap().values;
    assert_eq!(capacity["cuda.mig.1g.18gb"], "2");
    assert_eq!(capacity["cuda.mig.3g.71gb"], "1");
    // The whole GPU and the four instances are the devices; the parent is not one.
    assert_eq!(info.devices.len(), 5);
    assert!(
        info.devices
            .iter()
            .all(|d| d.uuid != "GPU-6a4c2f9e-0000-4000-8000-000000000001")
    );
    // An allocation naming a profile is one of this node's slots.
    let known = known_slots(&config, &backend);
    let alloc = pb::Allocate {
        session_id: "s".into(),
        slots: Some(pb::ResourceSlot {
            values: [("cuda.mig.1g.18gb".to_owned(), "1".to_owned())].into(),
        }),
        ..Default::default()
    };
    // Named without an instance to hold it on, it is refused rather than held nowhere.
    let nack = check_allocation(&known, &alloc).unwrap();
    assert_eq!(nack.reason, "UnsupportedResource");
    assert!(
        nack.message.contains("cuda.mig.1g.18gb"),
        "{}",
        nack.message
    );
    let placed = pb::Allocate {
        devices: vec![pb::DeviceShare {
            index: 2,
            ..Default::default()
        }],
        ..alloc
    };
    assert!(check_allocation(&known, &placed).is_none());
}

/// Issue 38: a `Resume` naming other GPUs becomes a move only onto whole GPUs of the same model,
/// its pairs by this node's own UUIDs (not the ones the controller sent), and the allocation on
/// the new GPUs is held only once the session resumed.
#[test]
fn a_resume_onto_other_gpus_pairs_this_node_s_uuids_for_the_same_model_only() {
    const GPUS: &str = r#"
[[devices]]
uuid = "GPU-6a4c2f9e-0000-4000-8000-0000000000b0"
model_name = "Mock H100"
memory_size = "16G"
[[devices]]
uuid = "GPU-6a4c2f9e-0000-4000-8000-0000000000b1"
model_name = "Mock H100"
memory_size = "16G"
[[devices]]
uuid = "GPU-6a4c2f9e-0000-4000-8000-0000000000b2"
model_name = "Mock A100"
memory_size = "16G"
"#;
    let (_config, holdings, _dir) = link_to("http://127.0.0.1:1");
    let backend =
        crate::devices::mock::MockBackend::from_toml(GPUS, std::path::Path::new("gpus.toml"))
            .unwrap();
    let share = |index| pb::DeviceShare {
        index,
        uuid: "whatever the controller says".into(),
        shares: "1".into(),
        ..Default::default()
    };
    lock(&holdings)
        .hold(pb::Allocate {
            session_id: "s".into(),
            devices: vec![share(0)],
            target: Some(pb::Target {
                kind: Some(pb::target::Kind::CgroupPath("/job".into())),
            }),
            ..Default::default()
        })
        .unwrap();
    let resume = |devices| {
        resume_command(
            &backend,
            &holdings,
            pb::Resume {
                session_id: "s".into(),
                devices,
            },
        )
    };
    let plain = Ok(QuotaCommand::Resume("s".into()));
    assert_eq!(resume(vec![]), plain, "none named: where it was");
    assert_eq!(resume(vec![share(0)]), plain, "the GPU it holds");
    let other_model = resume(vec![share(2)]).unwrap_err();
    assert!(other_model.contains("Mock A100"), "{other_model}");
    assert!(resume(vec![share(0), share(1)]).is_err(), "two for one");
    let Ok(QuotaCommand::ResumeOnto { session, moving }) = resume(vec![share(1)]) else {
        panic!("no move");
    };
    assert_eq!(session, "s");
    assert_eq!(
        moving.pairs,
        [GpuPair {
            old: "GPU-6a4c2f9e-0000-4000-8000-0000000000b0".into(),
            new: "GPU-6a4c2f9e-0000-4000-8000-0000000000b1".into(),
        }]
    );
    let indexes: Vec<u32> = moving.spec.devices.iter().map(|d| d.index).collect();
    assert_eq!(indexes, [1]);
    let held = |h: &SharedHoldings| lock(h).get("s").unwrap().devices[0].index;
    assert_eq!(held(&holdings), 0, "not held before it resumed");
    lock(&holdings).settle_move("s", true).unwrap();
    assert_eq!(held(&holdings), 1);
    // GPUs whose UUIDs are no driver's (mock names) cannot be paired: refused before any move.
    let named = crate::devices::mock::MockBackend::from_toml(
        &GPUS.replace("6a4c2f9e-0000-4000-8000-0000000000b", "made-up-"),
        std::path::Path::new("named.toml"),
    )
    .unwrap();
    let why = resume_command(
        &named,
        &holdings,
        pb::Resume {
            session_id: "s".into(),
            devices: vec![share(0)],
        },
    )
    .unwrap_err();
    assert!(why.contains("is not a GPU UUID"), "{why}");
    // A refused move leaves what was held.
    resume(vec![share(0)]).unwrap();
    lock(&holdings).settle_move("s", false).unwrap();
    assert_eq!(held(&holdings), 1);
}

#[test]
fn only_the_listed_gpus_report_their_mig_layout() {
    let (mut config, _holdings, _dir) = link_to("http://127.0.0.1:1");
    // Two H200s in MIG mode, each with a 3g.71gb at slices 0-3.
    let gpu = |n: u32| {
        format!(
            "[[devices]]\nuuid = \"GPU-{n}\"\nmodel_name = \"Mock H200\"\nmemory_size = \"141G\"\n\
             mig_enabled = true\n[[devices.instances]]\nuuid = \"MIG-{n}\"\nprofile = \"3g.71gb\"\n\
             gpu_instance = 1\nplacement_start = 0\nmemory_size = \"70G\"\n"
        )
    };
    let backend = crate::devices::mock::MockBackend::from_toml(
        &(gpu(0) + &gpu(1)),
        std::path::Path::new("m.toml"),
    )
    .unwrap();
    // By default none.
    let info = node_info(&config, &backend, vec![], None);
    assert!(info.mig_layouts.is_empty());
    assert!(info.slot_types.iter().all(|t| t.name != "cuda.mig.1g.18gb"));
    config.mig_reconfigurable = vec!["GPU-1".into()];
    let info = node_info(&config, &backend, vec![], None);
    assert_eq!(info.mig_layouts.len(), 1);
    let l = &info.mig_layouts[0];
    assert_eq!(
        (l.gpu_uuid.as_str(), l.gpu_index, l.slices),
        ("GPU-1", 1, 8)
    );
    assert_eq!(l.occupied, [pb::MigPlacement { start: 0, size: 4 }]);
    let free = |name: &str| {
        l.profiles
            .iter()
            .find(|p| p.profile == name)
            .map(|p| p.free.clone())
            .unwrap()
    };
    assert_eq!(free("3g.71gb"), [4]);
    assert_eq!(free("1g.18gb"), [4, 5, 6]);
    assert!(free("4g.71gb").is_empty());
    // Every profile it could make is a slot type of the node, with no instance yet.
    let types: Vec<&str> = info.slot_types.iter().map(|t| t.name.as_str()).collect();
    assert!(types.contains(&"cuda.mig.1g.18gb") && types.contains(&"cuda.mig.7g.141gb"));
    assert!(
        !info
            .capacity
            .as_ref()
            .unwrap()
            .values
            .contains_key("cuda.mig.1g.18gb")
    );

    // A GPU in MIG mode with no instance yet, the node's only one: the node offers no device,
    // yet a request for an instance with a memory limit names the GPU slots.
    let empty = crate::devices::mock::MockBackend::from_toml(
        "[[devices]]\nuuid = \"GPU-0\"\nmodel_name = \"Mock H200\"\nmemory_size = \"141G\"\n\
         mig_enabled = true\n",
        std::path::Path::new("m.toml"),
    )
    .unwrap();
    config.mig_reconfigurable = vec!["GPU-0".into()];
    let info = node_info(&config, &empty, vec![], None);
    assert!(info.devices.is_empty());
    let types: Vec<&str> = info.slot_types.iter().map(|t| t.name.as_str()).collect();
    for name in ["cuda.device", "cuda.shares", "cuda.mem", "cuda.mig.1g.18gb"] {
        assert!(types.contains(&name), "{name} in {types:?}");
    }
    assert!(
        !info
            .capacity
            .unwrap()
            .values
            .contains_key("cuda.mig.1g.18gb")
    );
}

/// Issue 38: the agent stops between a `Resume` onto other GPUs and its answer. The next run
/// holds the old GPUs (its store) and tells the controller, which booked the new ones, that the
/// move did not happen: `resume_refused`, naming both; a move this run settles is not told.
#[test]
fn a_move_cut_short_by_a_restart_is_refused_to_the_controller_by_the_next_run() {
    const GPUS: &str = r#"
[[devices]]
uuid = "GPU-6a4c2f9e-0000-4000-8000-0000000000c0"
model_name = "Mock H100"
memory_size = "16G"
[[devices]]
uuid = "GPU-6a4c2f9e-0000-4000-8000-0000000000c1"
model_name = "Mock H100"
memory_size = "16G"
"#;
    let backend =
        crate::devices::mock::MockBackend::from_toml(GPUS, std::path::Path::new("gpus.toml"))
            .unwrap();
    let scratch = gpuwarden_test_support::scratch("link-moves");
    let store = scratch.path().join("store");
    let share = |index| pb::DeviceShare {
        index,
        shares: "1".into(),
        ..Default::default()
    };
    let open =
        || -> SharedHoldings { Arc::new(std::sync::Mutex::new(Holdings::open(&store).unwrap())) };
    let resume_onto_1 = |holdings: &SharedHoldings, session: &str| {
        let command = resume_command(
            &backend,
            holdings,
            pb::Resume {
                session_id: session.into(),
                devices: vec![share(1)],
            },
        );
        assert!(
            matches!(command, Ok(QuotaCommand::ResumeOnto { .. })),
            "{command:?}"
        );
    };
    {
        let holdings = open();
        for session in ["cut", "done"] {
            lock(&holdings)
                .hold(pb::Allocate {
                    session_id: session.into(),
                    devices: vec![share(0)],
                    target: Some(pb::Target {
                        kind: Some(pb::target::Kind::CgroupPath(format!("/{session}"))),
                    }),
                    ..Default::default()
                })
                .unwrap();
            resume_onto_1(&holdings, session);
        }
        lock(&holdings).settle_move("done", true).unwrap();
        assert!(
            interrupted_moves(&holdings).is_empty(),
            "nothing cut short yet"
        );
    }
    let holdings = open();
    let told = interrupted_moves(&holdings);
    assert_eq!(told.len(), 1, "{told:?}");
    let (to, refusal) = &told[0];
    assert_eq!(to.devices[0].index, 1, "the allocation it was going to");
    assert_eq!(
        (refusal.session_id.as_str(), refusal.action.as_str()),
        ("cut", "resume_refused")
    );
    assert!(
        refusal.reason.contains("not resumed on GPUs 1")
            && refusal.reason.contains("restarted during the move")
            && refusal.reason.contains("holding GPUs 0"),
        "{}",
        refusal.reason
    );
    assert_eq!(lock(&holdings).get("cut").unwrap().devices[0].index, 0);
    // Taken up by this run: no longer listed, and settled as any move of its own.
    lock(&holdings).take_up_move("cut");
    assert!(interrupted_moves(&holdings).is_empty());
    lock(&holdings).settle_move("cut", true).unwrap();
    assert_eq!(lock(&holdings).get("cut").unwrap().devices[0].index, 1);
    assert_eq!(lock(&holdings).get("done").unwrap().devices[0].index, 1);
}
