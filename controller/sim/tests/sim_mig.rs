//! The trace replay with MIG nodes (issue 37, docs/simulation.md "MIG nodes"), judged at every
//! step by an account of its own: what the sessions hold, read from the scheduler's sessions,
//! against the devices the nodes' reports list and the instances' placements the simulated
//! agents hold, checked with the placement rules of NVIDIA's MIG user guide as docs/mig.md
//! cites them (written out here, apart from the simulator's table).

use std::collections::{BTreeMap, BTreeSet};

use gpuwarden_controller::placement::Placement;
use gpuwarden_sim::{
    SimConfig,
    cluster::ClusterShape,
    run::{self, ModeRun, Step},
    trace::{self, GenConfig},
};

/// An H200's profiles as `nvidia-smi mig -lgipp` lists them (docs/mig.md, "The placement rules
/// and where they come from"): name, memory slices, allowed starts. Memory slices are 0..8.
const RULES: &[(&str, u32, &[u32])] = &[
    ("7g.141gb", 8, &[0]),
    ("4g.71gb", 4, &[0]),
    ("3g.71gb", 4, &[0, 4]),
    ("2g.35gb", 2, &[0, 2, 4]),
    ("1g.35gb", 2, &[0, 2, 4, 6]),
    ("1g.18gb", 1, &[0, 1, 2, 3, 4, 5, 6]),
];
const SLICES: u32 = 8;

fn rule(profile: &str) -> (u32, &'static [u32]) {
    let (_, size, starts) = RULES
        .iter()
        .find(|(name, _, _)| *name == profile)
        .unwrap_or_else(|| panic!("{profile} is no H200 profile"));
    (*size, starts)
}

/// Four nodes × 8 GPUs, the last two in MIG mode, and a trace where 30% of the jobs ask for
/// one instance.
fn setup() -> (Vec<trace::Job>, SimConfig) {
    let config = SimConfig {
        cluster: ClusterShape {
            nodes: 4,
            gpus_per_node: 8,
        },
        mig_nodes: 2,
        ..SimConfig::default()
    };
    let jobs = trace::generate(
        &GenConfig {
            jobs: 300,
            gpus: config.cluster.gpus(),
            median_work: 600.0,
            mig: 0.3,
            ..GenConfig::default()
        },
        5,
    );
    (jobs, config)
}

/// What the account keeps across steps.
#[derive(Default)]
struct Account {
    steps: usize,
    /// Instances made by the agents that a session has held, by (node, device index).
    held_once: BTreeSet<(String, u32)>,
    /// Made instances seen, by (node, device index).
    made_seen: BTreeSet<(String, u32)>,
    /// Made instances seen gone again.
    gone: usize,
    /// Profile sessions seen on an instance made for the run.
    on_made: usize,
    /// Most sessions held at once on the MIG nodes' instances.
    most_on_instances: usize,
}

impl Account {
    #[expect(clippy::too_many_lines, reason = "one account, read top to bottom")]
    fn check(&mut self, step: &Step<'_>) {
        self.steps += 1;
        let t = step.t;
        // The slices each GPU's instances hold, from the agents' placements.
        let mut instance_of: BTreeMap<(String, u32), String> = BTreeMap::new();
        for (id, agent) in step.mig {
            let report = &step.sched.nodes()[id].report;
            for gpu in &agent.gpus {
                let mut held = 0u32;
                let mut placements = BTreeSet::new();
                for i in &gpu.instances {
                    let (size, starts) = rule(i.profile.name);
                    assert!(
                        starts.contains(&i.start) && i.start + size <= SLICES,
                        "t={t}: {id} {} has a {} at slice {}, a start it may not take",
                        gpu.uuid,
                        i.profile.name,
                        i.start
                    );
                    let mask = ((1u32 << size) - 1) << i.start;
                    assert_eq!(
                        held & mask,
                        0,
                        "t={t}: on {id} {} the {} at slice {} takes a memory slice another instance holds",
                        gpu.uuid,
                        i.profile.name,
                        i.start
                    );
                    held |= mask;
                    placements.insert((i.start, size));
                    instance_of.insert((id.clone(), i.index), i.profile.name.to_owned());
                    if i.made_here() {
                        self.made_seen.insert((id.clone(), i.index));
                    }
                }
                // What the controller was last told of this GPU is what it holds.
                if gpu.reconfigurable {
                    let layout = report
                        .mig_layouts
                        .iter()
                        .find(|l| l.gpu_uuid == gpu.uuid)
                        .unwrap_or_else(|| panic!("t={t}: {} not reported", gpu.uuid));
                    let reported: BTreeSet<(u32, u32)> = layout.occupied.iter().copied().collect();
                    assert_eq!(reported, placements, "t={t}: {id} {}", gpu.uuid);
                } else {
                    assert!(
                        report.mig_layouts.iter().all(|l| l.gpu_uuid != gpu.uuid),
                        "t={t}: {} is the operator's, never offered for change",
                        gpu.uuid
                    );
                    assert_eq!(gpu.instances.len(), 4, "t={t}: the balanced layout stays");
                }
            }
            // The report's devices are exactly the instances, each named by its profile; no
            // parent GPU is offered whole.
            let listed: BTreeMap<u32, String> = report
                .devices
                .iter()
                .zip(&report.device_models)
                .map(|(d, (model, is_mig))| {
                    assert!(*is_mig, "t={t}: {id} offers {} whole", d.uuid);
                    let profile = model
                        .split_once(" MIG ")
                        .map(|(_, p)| p.to_owned())
                        .unwrap_or_default();
                    (d.index, profile)
                })
                .collect();
            let held: BTreeMap<u32, String> = instance_of
                .iter()
                .filter(|((n, _), _)| n == id)
                .map(|((_, i), p)| (*i, p.clone()))
                .collect();
            assert_eq!(listed, held, "t={t}: {id}'s report against its instances");
        }
        // What the agents hold, the controller's map holds too (else the account below,
        // read from the map, would miss it).
        for (session, node, devices) in step.held() {
            let s = &step.sched.sessions()[session];
            let indexes: Vec<u32> = s.allocation.parts.iter().map(|p| p.index).collect();
            assert!(
                s.state.holds_resources() && s.node.as_deref() == Some(node) && indexes == devices,
                "t={t}: {session} runs on {node} {devices:?}; the controller has it {:?} on {:?} {indexes:?}",
                s.state,
                s.node
            );
        }
        // Every session holding devices: on devices its node lists, no device over one whole,
        // a device held whole held by one session only, a profile session on instances of its
        // profile.
        let mut shares: BTreeMap<(String, u32), f64> = BTreeMap::new();
        let mut holders: BTreeMap<(String, u32), Vec<(&str, bool)>> = BTreeMap::new();
        let mut on_instances = 0;
        for s in step.sched.sessions().values() {
            if !s.state.holds_resources() {
                continue;
            }
            let Some(node) = &s.node else { continue };
            let report = &step.sched.nodes()[node].report;
            let profile: Vec<(String, f64)> = s
                .requested
                .iter()
                .filter_map(|(name, v)| {
                    name.as_str()
                        .strip_prefix("cuda.mig.")
                        .map(|p| (p.to_owned(), v.as_f64()))
                })
                .collect();
            for part in &s.allocation.parts {
                assert!(
                    report.devices.iter().any(|d| d.index == part.index),
                    "t={t}: {} holds device {} that {node} no longer lists",
                    s.id,
                    part.index
                );
                let key = (node.clone(), part.index);
                *shares.entry(key.clone()).or_default() += part.shares.as_f64();
                holders
                    .entry(key.clone())
                    .or_default()
                    .push((s.id.as_str(), part.exclusive));
                if instance_of.contains_key(&key) {
                    on_instances += 1;
                    if self.made_seen.contains(&key) {
                        self.held_once.insert(key.clone());
                    }
                }
                if let Some((p, _)) = profile.first() {
                    assert_eq!(
                        instance_of.get(&key),
                        Some(p),
                        "t={t}: {} asked for a {p} and holds device {} of {node}",
                        s.id,
                        part.index
                    );
                    assert!(part.exclusive, "t={t}: {} holds its instance shared", s.id);
                    if self.made_seen.contains(&key) {
                        self.on_made += 1;
                    }
                }
            }
            if let Some((_, n)) = profile.first() {
                let parts = u32::try_from(s.allocation.parts.len()).unwrap_or(u32::MAX);
                assert!(
                    (f64::from(parts) - n).abs() < 1e-9,
                    "t={t}: {} holds {parts} instances for {n}",
                    s.id
                );
            }
        }
        self.most_on_instances = self.most_on_instances.max(on_instances);
        for (key, total) in &shares {
            assert!(
                *total <= 1.0 + 1e-9,
                "t={t}: device {key:?} holds {total} of one device"
            );
        }
        for (key, who) in &holders {
            assert!(
                who.len() == 1 || who.iter().all(|(_, whole)| !whole),
                "t={t}: device {key:?} held whole by one of {who:?}"
            );
        }
        // A made instance a session held and no session holds now is gone.
        let let_go: Vec<(String, u32)> = self
            .held_once
            .iter()
            .filter(|key| !holders.contains_key(*key))
            .cloned()
            .collect();
        for key in let_go {
            let exists = step
                .mig
                .get(&key.0)
                .and_then(|a| a.instance(key.1))
                .is_some();
            assert!(
                !exists,
                "t={t}: made instance {key:?} let go and not destroyed"
            );
            self.held_once.remove(&key);
            self.gone += 1;
        }
    }
}

fn replay(mode: Placement) -> (ModeRun, Account) {
    let (jobs, config) = setup();
    let mut account = Account::default();
    let run = run::run_observed(&jobs, mode, &config, 5, &mut |step| account.check(step))
        .expect("the replay finishes");
    (run, account)
}

#[test]
fn no_device_or_memory_slice_is_held_twice_at_any_step() {
    for mode in Placement::ALL {
        let (run, account) = replay(mode);
        let mig = run.mig.expect("MIG figures");
        assert!(account.steps > 100, "{mode}: {} steps", account.steps);
        // The replay was about something: profile jobs placed, sessions on instances at once.
        assert!(mig.requests > 50, "{mode}: {mig:?}");
        assert_eq!(mig.placed, mig.requests, "{mode}: {mig:?}");
        assert!(
            account.most_on_instances >= 8,
            "{mode}: at most {} sessions on instances at once",
            account.most_on_instances
        );
        // The controller never ordered a placement the hardware would refuse.
        assert_eq!(mig.refused, 0, "{mode}: {mig:?}");
        assert!(
            run.outcomes.iter().all(Option::is_some),
            "{mode}: {:?}",
            run.rejected
        );
    }
}

#[test]
fn instances_are_made_on_demand_and_destroyed_once_empty() {
    let (run, account) = replay(Placement::Binpack);
    let mig = run.mig.expect("MIG figures");
    assert!(mig.made > 0, "{mig:?}");
    assert_eq!(mig.made, mig.orders, "{mig:?}");
    assert_eq!(
        account.made_seen.len() as u64,
        mig.made,
        "each made instance seen"
    );
    // Sessions ran on made instances, and every one a session let go was destroyed by the
    // next step.
    assert!(account.on_made > 0, "no profile session on a made instance");
    assert!(
        account.gone > 0 && account.held_once.is_empty(),
        "{} gone, {:?} left",
        account.gone,
        account.held_once
    );
    assert!(mig.destroyed > 0 && mig.destroyed <= mig.made, "{mig:?}");
    assert!(mig.peak_made > 1, "{mig:?}");
}
