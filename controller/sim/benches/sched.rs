//! `cargo xtask bench sched`: scheduling decisions per second and latency per decision for
//! 10,000 pending mixed sessions over 1,000 and 5,000 nodes × 8 GPUs, and heartbeats per second
//! ingested from 1,000 simulated agents over real gRPC on loopback.
//!
//! Baseline in the same run: the time to merely walk the queue in order (sort and read each
//! pending session), so the table shows what deciding adds over touching each session. The row
//! with team quotas on (50 queues, each with a guarantee and a limit) is also read against
//! binpack's row of the same run: within 2× (≥ 0.5× its decisions/s), and so are the row on a
//! fleet with half its GPUs in MIG mode (issue 37: 30% of the requests ask for a MIG profile)
//! and the row where those GPUs hold no instance and each is made on demand (the simulated
//! agents making the instances the passes order, between passes).
//!
//! `cargo bench -p gpuwarden-sim --bench sched -- mig` runs binpack's row and the two MIG rows
//! only.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use gpuwarden_controller::{
    api::{Hub, Timing},
    limits::{Bounds, Limits},
    node::NodeReport,
    placement::Placement,
    scheduler::{
        Command, NewSession, Scheduler, SchedulerConfig,
        quotas::{QueueQuota, QuotaConfig},
    },
    server,
    slots::ResourceSlot,
    store::{Store, StoreSpec},
};
use gpuwarden_proto::v1::{self as pb, agent_service_client::AgentServiceClient};
use gpuwarden_sim::mig::MigNode;
use tokio_stream::StreamExt;

const SESSIONS: usize = 10_000;
const GPUS: u32 = 8;
/// Team queues of the quota row, and the owners spread over them.
const QUEUES: usize = 50;
const OWNERS: usize = 200;

/// A small deterministic generator (no dependency, same mix every run).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn report(id: usize) -> NodeReport {
    NodeReport {
        capacity: ResourceSlot::parse_any(&["cpu=64", "mem=512g"]).expect("valid"),
        agent_version: "bench".into(),
        ..NodeReport::with_gpus(&format!("node-{id:05}"), GPUS, 80 << 30, 4)
    }
}

/// 60% fractional (0.1–0.9), 25% whole devices (1–2), 15% multi-device fractional (1.2–3.0).
fn request(rng: &mut Rng) -> ResourceSlot {
    let roll = rng.below(100);
    let gpu = if roll < 60 {
        format!("cuda.shares=0.{}", 1 + rng.below(9))
    } else if roll < 85 {
        format!("cuda.device={}", 1 + rng.below(2))
    } else {
        format!("cuda.shares={}.{}", 1 + rng.below(2), 2 + rng.below(8))
    };
    ResourceSlot::parse_any(&["cpu=1", "mem=4g", gpu.as_str()]).expect("valid")
}

/// A node of the mixed fleet: GPUs 0–3 whole, GPUs 4–7 in MIG mode cut by their operator in
/// an H200's "balanced" layout (2 × 1g.18gb, 2g.35gb, 3g.71gb), offered as their instances (the
/// parent of instances is not offered whole), each profile a slot type with its count: the
/// report of the simulator's agent for such a node.
fn mig_report(id: usize) -> NodeReport {
    agent_report(&MigNode::cut(
        &format!("node-{id:05}"),
        GPUS / 2,
        GPUS / 2,
        4,
    ))
}

/// The mixed fleet's mix: 30% one MIG instance (half 1g, a quarter each 2g and 3g), the rest as
/// [`request`].
fn mig_request(rng: &mut Rng) -> ResourceSlot {
    if rng.below(10) < 3 {
        let profile = match rng.below(4) {
            0 | 1 => "1g.18gb",
            2 => "2g.35gb",
            _ => "3g.71gb",
        };
        let gpu = format!("cuda.mig.{profile}=1");
        return ResourceSlot::parse_any(&["cpu=1", "mem=4g", gpu.as_str()]).expect("valid");
    }
    request(rng)
}

/// 50 queues over 1,000 × 8 GPUs, owners spread round-robin (4 each). Guarantees of 100 to 180
/// shares (7,000 in all, of 8,000) and 25 to 45 whole devices, limits 1.5× those: with the
/// sessions' ~10,000 shares asked, queues borrow, and the smaller ones reach their limit.
fn quotas() -> QuotaConfig {
    let mut config = QuotaConfig::default();
    for q in 0..QUEUES {
        let step = (q % 5) as u64;
        let (shares, devices) = (100 + 20 * step, 25 + 5 * step);
        let slots = |shares: u64, devices: u64| {
            ResourceSlot::parse_any(&[
                format!("cuda.shares={shares}"),
                format!("cuda.device={devices}"),
            ])
            .expect("valid")
        };
        config.queues.insert(
            format!("q{q:02}"),
            QueueQuota {
                guaranteed: slots(shares, devices),
                limit: Some(slots(shares * 3 / 2, devices * 3 / 2)),
            },
        );
    }
    for o in 0..OWNERS {
        config
            .members
            .insert(format!("owner{o}"), format!("q{:02}", o % QUEUES));
    }
    config
}

struct Row {
    label: String,
    nodes: usize,
    decisions: usize,
    placed: usize,
    per_second: f64,
    baseline_per_second: f64,
    p50: Duration,
    p99: Duration,
}

/// Baseline: sessions/s to walk the pending sessions in queue order without deciding.
fn walk_only(s: &Scheduler) -> f64 {
    let started = Instant::now();
    let mut touched = 0usize;
    let mut order: Vec<_> = s.sessions().values().collect();
    order.sort_by_key(|x| (std::cmp::Reverse(x.priority), x.seq));
    for x in order {
        touched += usize::from(!x.requested.is_zero());
    }
    touched as f64 / started.elapsed().as_secs_f64().max(1e-9)
}

/// The median and 99th percentile of `latencies` (sorted here).
fn percentiles(latencies: &mut [Duration]) -> (Duration, Duration) {
    latencies.sort();
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a percentile's rank: non-negative and below the length"
    )]
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p) as usize];
    (pct(0.5), pct(0.99))
}

fn decisions(nodes: usize, mode: Placement, quotas: Option<QuotaConfig>, mig: bool) -> Row {
    let label = if quotas.is_some() {
        format!("{mode} + quotas ({QUEUES} queues)")
    } else if mig {
        format!("{mode}, half the GPUs in MIG mode")
    } else {
        mode.to_string()
    };
    let owners = if quotas.is_some() { OWNERS } else { 50 };
    let config = SchedulerConfig {
        strategy: mode,
        // Every pending session is tried in one pass (none blocks the queue).
        skip_after: 0,
        quotas: quotas.unwrap_or_default(),
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(config);
    for i in 0..nodes {
        let node = if mig { mig_report(i) } else { report(i) };
        s.register(node, &[]).expect("registers");
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..SESSIONS {
        s.create(NewSession {
            id: format!("s{i:05}"),
            owner: format!("owner{}", i % owners),
            requested: if mig {
                mig_request(&mut rng)
            } else {
                request(&mut rng)
            },
            ..NewSession::default()
        })
        .expect("valid request");
    }
    let baseline_per_second = walk_only(&s);

    let mut latencies = Vec::with_capacity(SESSIONS);
    let mut placed = 0;
    let started = Instant::now();
    s.pass_observed(&mut |d, ok| {
        latencies.push(d);
        placed += usize::from(ok);
    });
    let total = started.elapsed();
    let (p50, p99) = percentiles(&mut latencies);
    Row {
        label,
        nodes,
        decisions: latencies.len(),
        placed,
        per_second: latencies.len() as f64 / total.as_secs_f64(),
        baseline_per_second,
        p50,
        p99,
    }
}

/// The report of a node in MIG mode: its agent's, with the cpu and mem the requests ask for.
fn agent_report(node: &MigNode) -> NodeReport {
    let mut report = node.report();
    let base = ResourceSlot::parse_any(&["cpu=64", "mem=512g"]).expect("valid");
    for (name, value) in base.iter() {
        report.capacity.set(name.clone(), value);
    }
    report.agent_version = "bench".into();
    report
}

/// The fleet of [`mig_report`] with GPUs 4–7 reconfigurable and no instance on them: each
/// profile request has its instance made. Passes run until no order is left; between passes
/// the simulated agents make what was ordered and register again (the making itself is not
/// timed, the registrations are: they are the controller's work). Decisions/s counts every
/// decision of every pass.
fn on_demand(nodes: usize) -> (Row, Vec<String>, u64) {
    let config = SchedulerConfig {
        strategy: Placement::Binpack,
        skip_after: 0,
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(config);
    let mut agents: Vec<MigNode> = (0..nodes)
        .map(|i| MigNode::mixed(&format!("node-{i:05}"), GPUS / 2, GPUS / 2, 4))
        .collect();
    for a in &agents {
        s.register(agent_report(a), &[]).expect("registers");
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..SESSIONS {
        s.create(NewSession {
            id: format!("s{i:05}"),
            owner: format!("owner{}", i % 50),
            requested: mig_request(&mut rng),
            ..NewSession::default()
        })
        .expect("valid request");
    }
    let baseline_per_second = walk_only(&s);

    let mut latencies = Vec::with_capacity(2 * SESSIONS);
    let mut placed = 0;
    let mut timed = Duration::ZERO;
    let mut passes = 0;
    let mut made = 0u64;
    // Each pass and each round of registrations, with its time and what it did.
    let mut phases = Vec::new();
    loop {
        passes += 1;
        let started = Instant::now();
        let (before, placed_before) = (latencies.len(), placed);
        let commands = s.pass_observed(&mut |d, ok| {
            latencies.push(d);
            placed += usize::from(ok);
        });
        let took = started.elapsed();
        timed += took;
        let orders = commands
            .iter()
            .filter(|c| matches!(c, Command::MakeMigInstance { .. }))
            .count();
        phases.push(format!(
            "pass {passes}: {} decisions, {} placed, {orders} instances ordered, {:.0} ms",
            latencies.len() - before,
            placed - placed_before,
            took.as_secs_f64() * 1e3
        ));
        let mut changed = std::collections::BTreeSet::new();
        for c in commands {
            if let Command::MakeMigInstance {
                node,
                gpu_uuid,
                profile,
                start,
                ..
            } = c
                && let Some(i) = node
                    .strip_prefix("node-")
                    .and_then(|n| n.parse::<usize>().ok())
                && agents[i].make(&gpu_uuid, &profile, start, 0.0).is_ok()
            {
                made += 1;
                changed.insert(i);
            }
        }
        if changed.is_empty() || passes >= 10 {
            break;
        }
        let reports: Vec<NodeReport> = changed.iter().map(|&i| agent_report(&agents[i])).collect();
        let started = Instant::now();
        let count = reports.len();
        for r in reports {
            s.register(r, &[]).expect("registers again");
        }
        let took = started.elapsed();
        timed += took;
        phases.push(format!(
            "{count} nodes registered again: {:.0} ms",
            took.as_secs_f64() * 1e3
        ));
    }
    let (p50, p99) = percentiles(&mut latencies);
    let row = Row {
        label: format!("{}, instances made on demand", Placement::Binpack),
        nodes,
        decisions: latencies.len(),
        placed,
        per_second: latencies.len() as f64 / timed.as_secs_f64(),
        baseline_per_second,
        p50,
        p99,
    };
    (row, phases, made)
}

async fn heartbeats(agents: usize, seconds: u64) -> (f64, u64) {
    let dir = std::env::temp_dir().join(format!("gpuwarden-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&StoreSpec::Sled(dir.clone()))
        .await
        .expect("store");
    let timing = Timing {
        heartbeat_timeout: Duration::from_mins(10),
        ..Timing::default()
    };
    let controller = Hub::new(Scheduler::new(SchedulerConfig::default()), store, timing);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    // This row measures how fast heartbeats are taken in, so the per-stream rate limit (which
    // would close a stream sending thousands a second) is lifted.
    let limits = Limits {
        agent_messages_per_sec: u32::MAX,
        agent_message_burst: u32::MAX,
        ..Limits::default()
    };
    tokio::spawn(
        server::GrpcServer::new(Arc::clone(&controller), listener)
            .bounds(Bounds::new(limits))
            .serve(std::future::pending()),
    );
    let url = format!("http://{addr}");
    // A few connections carry all streams, as a real fleet's HTTP/2 multiplexing would per agent.
    let mut channels = Vec::new();
    for _ in 0..8 {
        channels.push(
            tonic::transport::Endpoint::from_shared(url.clone())
                .expect("url")
                .connect()
                .await
                .expect("connect"),
        );
    }
    let mut senders = Vec::new();
    for i in 0..agents {
        let mut client = AgentServiceClient::new(channels[i % channels.len()].clone());
        let node = format!("node-{i:05}");
        let mut info = pb::NodeInfo {
            node_id: node.clone(),
            hostname: node.clone(),
            ..Default::default()
        };
        info.slot_types.push(pb::SlotType {
            name: "cpu".into(),
            kind: pb::SlotKind::Count.into(),
        });
        client.register(info).await.expect("register");
        let (tx, rx) = tokio::sync::mpsc::channel::<pb::AgentMessage>(64);
        let hb = |seq| pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat {
                node_id: node.clone(),
                seq,
                running_sessions: vec![],
            })),
        };
        tx.send(hb(0)).await.expect("first heartbeat");
        let mut inbound = client
            .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("stream")
            .into_inner();
        tokio::spawn(async move { while inbound.next().await.is_some() {} });
        senders.push((tx, node));
    }
    let before = controller.heartbeats_received();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for (tx, node) in senders {
        tasks.push(tokio::spawn(async move {
            let mut seq = 1;
            while Instant::now() < deadline {
                let msg = pb::AgentMessage {
                    msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat {
                        node_id: node.clone(),
                        seq,
                        running_sessions: vec![],
                    })),
                };
                if tx.send(msg).await.is_err() {
                    break;
                }
                seq += 1;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed();
    // Let the server drain what is in flight, then count only what it ingested.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ingested = controller.heartbeats_received() - before;
    let _ = std::fs::remove_dir_all(&dir);
    (ingested as f64 / (elapsed.as_secs_f64() + 0.5), ingested)
}

/// Prints `r`'s row: against its `floor`, and against binpack's rate in this run (`base`) where
/// the row is read as a ratio to it (≥ 0.5×).
fn print_row(r: &Row, floor: f64, base: Option<f64>) {
    let mut verdict = if r.per_second >= floor {
        format!("≥ {floor:.0}/s within")
    } else {
        format!("≥ {floor:.0}/s BELOW")
    };
    if let Some(base) = base {
        let ratio = r.per_second / base;
        verdict = format!(
            "{verdict}; {ratio:.2}× binpack's {base:.0}/s in this run (≥ 0.50×: {})",
            if ratio >= 0.5 { "within" } else { "BELOW" }
        );
    }
    println!(
        "| {} | {} × {GPUS} | {} | {} | {:.0} | {:.0} | {:.1} µs | {:.1} µs | {verdict} |",
        r.label,
        r.nodes,
        r.decisions,
        r.placed,
        r.per_second,
        r.baseline_per_second,
        r.p50.as_secs_f64() * 1e6,
        r.p99.as_secs_f64() * 1e6,
    );
}

fn main() {
    println!(
        "\ncargo xtask bench sched — {SESSIONS} pending mixed sessions (60% fractional, 25% whole-device, 15% multi-device), one pass"
    );
    println!(
        "| mode | nodes × GPUs | decisions | placed | decisions/s | walk-only baseline/s | p50 per decision | p99 per decision | floor |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---|");
    // Interference-aware scores up to `max_nodes` nodes' devices with the co-location model
    // (every session's class unknown here, so every tenant has the prior: the costliest case).
    // The quota row runs right after binpack's on the same nodes and sessions, and is read
    // against it.
    let mig_only = std::env::args().skip(1).any(|a| a == "mig");
    let mut binpack = None;
    for (mode, nodes, quotas, mig, floor) in [
        (Placement::Binpack, 1_000, None, false, 5_000.0),
        (Placement::Binpack, 1_000, Some(quotas()), false, 5_000.0),
        (Placement::Binpack, 1_000, None, true, 5_000.0),
        (Placement::Binpack, 5_000, None, false, 1_000.0),
        (Placement::InterferenceAware, 1_000, None, false, 1_000.0),
    ] {
        if mig_only && (quotas.is_some() || (!mig && nodes != 1_000) || mode != Placement::Binpack)
        {
            continue;
        }
        let governed = quotas.is_some() || mig;
        let r = decisions(nodes, mode, quotas, mig);
        print_row(&r, floor, binpack.filter(|_| governed));
        if !governed && mode == Placement::Binpack && nodes == 1_000 {
            binpack = Some(r.per_second);
        }
    }
    let (r, phases, made) = on_demand(1_000);
    print_row(&r, 5_000.0, binpack);
    println!(
        "\ninstances made on demand: {made} made; decisions/s counts every pass's decisions over the passes' and the registrations' time: {}",
        phases.join("; ")
    );
    if mig_only {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (rate, total) = runtime.block_on(heartbeats(1_000, 5));
    println!("\n| agents | heartbeats ingested | heartbeats/s | floor |");
    println!("|---:|---:|---:|---|");
    println!(
        "| 1000 | {total} | {rate:.0} | ≥ 10000/s {} |",
        if rate >= 10_000.0 { "within" } else { "BELOW" }
    );
}
