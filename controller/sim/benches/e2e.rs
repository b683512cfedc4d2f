//! `cargo xtask bench e2e`: sessions per second from create to RUNNING, and the latency of each,
//! played over real gRPC on loopback: fake agents (one stream each, heartbeating every 2 s as
//! agents do, acknowledging every allocation at once) on 1,000 nodes × 8 GPUs, and concurrent clients creating 5,000 mixed
//! fractional sessions. Run on sled and on a real etcd (Debian's, started here), each with group
//! commit and, as the baseline measured in the same run, with one change per commit. Then the
//! failover time: two controllers on etcd, the leader killed, until the standby leads (three
//! rounds). Then the scale rows: the same at 10,000 nodes and 50,000 sessions (or the size
//! `GPUWARDEN_BENCH_SCALE=NODESxSESSIONS` names), with group commit, on sled and etcd, beside
//! the 1,000-node row as ratios; each row says how many sessions' RUNNING the watcher never saw
//! (must be 0), the scheduling passes that had sessions to try (how many, their mean time beside
//! the 1,000-node row's, the longest), the heartbeats ingested, and the bench process's peak RSS (controller, fake
//! agents and clients together) per node and per session.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use gpuwarden_controller::{
    api::{Hub, Timing},
    limits::{Bounds, Limits},
    scheduler::{Scheduler, SchedulerConfig},
    server,
    store::{Store, StoreSpec},
};
use gpuwarden_proto::v1::{
    self as pb, agent_service_client::AgentServiceClient,
    scheduler_service_client::SchedulerServiceClient,
};
use gpuwarden_test_support::{Etcd, scratch};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// The allocator the controller binary runs with (`controller/src/bin/gpuwarden-controller.rs`);
/// the fake agents, clients and watcher in this process share it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NODES: usize = 1_000;
const GPUS: u32 = 8;
const SESSIONS: usize = 5_000;
const CLIENTS: usize = 64;
/// HTTP/2 connections the fake agents share at least, as a fleet's would be spread over the
/// controller.
const AGENT_CONNECTIONS: usize = 8;
/// Fake agents per shared connection at most: half the streams the server holds open on one
/// connection, as a stream past that waits for ever in the client's stack (10,000 agents on 8
/// connections hung the scale row).
const AGENTS_PER_CONNECTION: usize = server::MAX_STREAMS_PER_CONNECTION as usize / 2;

/// How big a run is.
#[derive(Clone, Copy)]
struct Size {
    nodes: usize,
    sessions: usize,
}

/// The size of the rows that compare commit modes.
const BASE: Size = Size {
    nodes: NODES,
    sessions: SESSIONS,
};

struct Row {
    store: &'static str,
    grouped: bool,
    size: Size,
    running: usize,
    /// Sessions whose RUNNING the watcher never saw.
    missed: usize,
    /// Heartbeats the controller ingested.
    heartbeats: u64,
    /// Scheduling passes that had a session to try: how many, their total time, the longest.
    passes: (u64, Duration, Duration),
    /// Creating every session until the last RUNNING, in seconds.
    took: f64,
    /// This process's resident memory before the run, and with everything of it still up.
    rss_before: u64,
    rss: u64,
    per_second: f64,
    p50: Duration,
    p99: Duration,
    commits: u64,
    changes: u64,
}

fn node_info(i: usize) -> pb::NodeInfo {
    let node = format!("node-{i:05}");
    let slot = |name: &str, kind: pb::SlotKind| pb::SlotType {
        name: name.into(),
        kind: kind.into(),
    };
    pb::NodeInfo {
        node_id: node.clone(),
        hostname: node,
        slot_types: vec![
            slot("cuda.shares", pb::SlotKind::Count),
            slot("cuda.device", pb::SlotKind::Count),
            slot("cuda.mem", pb::SlotKind::Bytes),
        ],
        devices: (0..GPUS)
            .map(|g| pb::Device {
                uuid: format!("GPU-{i}-{g}"),
                model: "Fake".into(),
                memory_bytes: 80 << 30,
                sm_count: 132,
                index: g,
                numa_node: i32::try_from(g / 4).unwrap_or(0),
                device_node: format!("/dev/nvidia{g}"),
                ..Default::default()
            })
            .collect(),
        agent_version: "bench".into(),
        ..Default::default()
    }
}

/// A fake agent: registers, opens its stream, heartbeats as often as a real agent does, and
/// acknowledges every allocation.
async fn agent(channel: Channel, info: pb::NodeInfo) {
    let mut client = AgentServiceClient::new(channel);
    let node = info.node_id.clone();
    let beating = node.clone();
    client.register(info).await.expect("registers");
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::AgentMessage>(256);
    tx.send(pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat {
            node_id: node,
            seq: 0,
            running_sessions: vec![],
        })),
    })
    .await
    .expect("first heartbeat");
    let mut inbound = client
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    let beat = tx.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Timing::default().heartbeat_interval);
        tick.tick().await;
        for seq in 1.. {
            tick.tick().await;
            let heartbeat = pb::agent_message::Msg::Heartbeat(pb::Heartbeat {
                node_id: beating.clone(),
                seq,
                running_sessions: vec![],
            });
            let message = pb::AgentMessage {
                msg: Some(heartbeat),
            };
            // The stream is gone once the run ends.
            if beat.send(message).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(Ok(message)) = inbound.next().await {
            if let Some(pb::controller_message::Msg::Allocate(a)) = message.msg {
                let ack = pb::agent_message::Msg::Ack(pb::AllocationAck {
                    session_id: a.session_id,
                });
                if tx.send(pb::AgentMessage { msg: Some(ack) }).await.is_err() {
                    break;
                }
            }
        }
    });
}

async fn connect(url: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(url.to_owned())
        .expect("a URL")
        .connect()
        .await
        .expect("connects")
}

fn request(i: usize, owners: usize) -> pb::CreateSessionRequest {
    // 0.1 to 0.5 of a GPU: 5 sessions per node of 8 GPUs fit, so every one runs.
    let shares = format!("0.{}", 1 + i % 5);
    pb::CreateSessionRequest {
        requested: Some(pb::ResourceSlot {
            values: [("cuda.shares".to_owned(), shares)].into(),
        }),
        owner: format!("user-{}", i % owners),
        name: format!("job-{i:05}"),
        ..Default::default()
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "the benchmark's run reads as one piece"
)]
async fn run(store: Store, label: &'static str, grouped: bool, size: Size) -> Row {
    let Size { nodes, sessions } = size;
    let rss_before = rss();
    // Each owner may hold 1,000 sessions at once.
    let owners = sessions.div_ceil(1_000).max(16);
    let store = if grouped {
        store
    } else {
        store.one_change_per_commit()
    };
    let timing = Timing {
        heartbeat_timeout: Duration::from_mins(10),
        pass_interval: Duration::from_millis(20),
        ..Timing::default()
    };
    let controller = Hub::new(
        Scheduler::new(SchedulerConfig::default()),
        store.clone(),
        timing,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    // Every client here shares one address: the rate limits are not what is measured.
    let limits = Limits {
        client_requests_per_sec: 1_000_000,
        client_request_burst: 1_000_000,
        ..Limits::default()
    };
    let server = tokio::spawn(
        server::GrpcServer::new(Arc::clone(&controller), listener)
            .bounds(Bounds::new(limits))
            .serve(std::future::pending()),
    );

    let mut channels = Vec::new();
    let shared = AGENT_CONNECTIONS.max(nodes.div_ceil(AGENTS_PER_CONNECTION));
    for _ in 0..shared {
        channels.push(connect(&url).await);
    }
    let agents: Vec<_> = (0..nodes)
        .map(|i| tokio::spawn(agent(channels[i % shared].clone(), node_info(i))))
        .collect();
    for a in agents {
        a.await.expect("agent up");
    }

    // Watch before creating: every session's RUNNING is seen as it happens.
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let client = SchedulerServiceClient::new(connect(&url).await);
    let mut watch = client
        .clone()
        .watch_sessions(pb::WatchSessionsRequest::default())
        .await
        .expect("watches")
        .into_inner();
    let (all_running, mut done) = tokio::sync::oneshot::channel::<Instant>();
    let watcher = {
        let sent = Arc::clone(&sent);
        let latencies = Arc::clone(&latencies);
        tokio::spawn(async move {
            let mut all_running = Some(all_running);
            while let Some(Ok(s)) = watch.next().await {
                if s.state != i32::from(pb::SessionState::Running) {
                    continue;
                }
                let started = sent.locked().remove(&s.name);
                if let Some(started) = started {
                    let mut l = latencies.locked();
                    l.push(started.elapsed());
                    if l.len() == sessions
                        && let Some(tx) = all_running.take()
                    {
                        let _ = tx.send(Instant::now());
                    }
                }
            }
        })
    };

    let started = Instant::now();
    let creators: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let mut client = client.clone();
            let sent = Arc::clone(&sent);
            tokio::spawn(async move {
                for i in (c..sessions).step_by(CLIENTS) {
                    let r = request(i, owners);
                    sent.locked().insert(r.name.clone(), Instant::now());
                    client.create_session(r).await.expect("created");
                }
            })
        })
        .collect();
    for c in creators {
        c.await.expect("creator");
    }
    // Two minutes per 5,000 sessions before what never arrived counts as missed.
    let patience = Duration::from_mins(2) * u32::try_from(sessions.div_ceil(5_000)).unwrap_or(1);
    let finished = tokio::time::timeout(patience, &mut done)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(Instant::now);
    let elapsed = finished - started;
    let rss_now = rss();
    watcher.abort();
    server.abort();
    let mut l = latencies.locked().clone();
    l.sort();
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a percentile's rank: non-negative and below the length"
    )]
    let pct = |p: f64| {
        l.get(((l.len().max(1) - 1) as f64 * p) as usize)
            .copied()
            .unwrap_or_default()
    };
    let (commits, changes) = store.commit_counts();
    Row {
        store: label,
        grouped,
        size,
        running: l.len(),
        missed: sessions - l.len(),
        heartbeats: controller.heartbeats_received(),
        passes: controller.pass_times(),
        took: elapsed.as_secs_f64(),
        rss_before,
        rss: rss_now,
        per_second: l.len() as f64 / elapsed.as_secs_f64(),
        p50: pct(0.5),
        p99: pct(0.99),
        commits,
        changes,
    }
}

fn print(row: &Row, baseline: Option<&Row>, floor: Option<(f64, Option<Duration>)>) {
    let ratio = baseline.map_or_else(
        || "1.00× (baseline)".to_owned(),
        |b| format!("{:.2}×", row.per_second / b.per_second.max(1e-9)),
    );
    let floor = floor.map_or_else(String::new, |(rate, p99)| {
        let met = row.per_second >= rate
            && p99.is_none_or(|p99| row.p99 <= p99)
            && row.running == row.size.sessions;
        let p99 = p99.map_or_else(String::new, |p| format!(", p99 ≤ {} ms", p.as_millis()));
        format!(
            "≥ {rate:.0}/s{p99}: {}",
            if met { "met" } else { "NOT MET" }
        )
    });
    println!(
        "| {} | {} | {}/{} | {:.0} | {ratio} | {:.1} ms | {:.1} ms | {} / {} | {floor} |",
        row.store,
        if row.grouped {
            "group commit"
        } else {
            "one change per commit"
        },
        row.running,
        row.size.sessions,
        row.per_second,
        row.p50.as_secs_f64() * 1e3,
        row.p99.as_secs_f64() * 1e3,
        row.commits,
        row.changes,
    );
}

/// A controller campaigning on `store` on a runtime of its own (dropping the runtime is as abrupt
/// as killing the process); its URL.
fn elected(store: &StoreSpec) -> (tokio::runtime::Runtime, String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut config = server::RunConfig::new(
        std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        store.clone(),
    );
    config.lease_ttl = TTL;
    let running = rt
        .block_on(async { server::App::build(config).await.map(server::App::spawn) })
        .expect("serves");
    let url = format!("http://{}", running.addr());
    // Runs until the runtime is dropped.
    rt.spawn(running.run_until(std::future::pending()));
    (rt, url)
}

/// Whether the controller at `url` answers as the leader.
async fn leads(url: &str) -> bool {
    let Ok(endpoint) = tonic::transport::Endpoint::from_shared(url.to_owned()) else {
        return false;
    };
    let Ok(channel) = endpoint.connect().await else {
        return false;
    };
    SchedulerServiceClient::new(channel)
        .list_slot_types(pb::ListSlotTypesRequest {})
        .await
        .is_ok()
}

/// The lease TTL of the failover rows.
const TTL: Duration = Duration::from_secs(2);

/// Time from killing the leader until the standby answers as the leader.
fn failover(store: &StoreSpec, probe: &tokio::runtime::Runtime) -> Duration {
    let (leader_rt, leader) = elected(store);
    while !probe.block_on(leads(&leader)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_standby_rt, standby) = elected(store);
    // Let the standby settle into waiting.
    std::thread::sleep(Duration::from_millis(500));
    let killed = Instant::now();
    leader_rt.shutdown_background();
    while !probe.block_on(leads(&standby)) {
        std::thread::sleep(Duration::from_millis(10));
    }
    killed.elapsed()
}

/// The resident memory of this process now, in bytes (`VmRSS`).
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib << 10)
}

/// The scale rows' size: `GPUWARDEN_BENCH_SCALE=NODESxSESSIONS`, 10,000 × 50,000 by default.
fn scale() -> Size {
    let given = std::env::var("GPUWARDEN_BENCH_SCALE").unwrap_or_default();
    let parsed = given
        .split_once('x')
        .and_then(|(n, s)| Some((n.parse().ok()?, s.parse().ok()?)));
    match parsed {
        Some((nodes, sessions)) => Size { nodes, sessions },
        None => Size {
            nodes: 10_000,
            sessions: 50_000,
        },
    }
}

/// A row's mean scheduling pass, in seconds.
fn mean_pass(row: &Row) -> f64 {
    let (count, total, _) = row.passes;
    total.as_secs_f64() / count.max(1) as f64
}

/// A scale row beside the 1,000-node row of the same store: how each cost grows.
fn print_scale(row: &Row, small: &Row) {
    let rss = row.rss;
    let grew = row.rss.saturating_sub(row.rss_before);
    let ratio = |a: f64, b: f64| a / b.max(1e-9);
    println!(
        "| {} | {} × {} | {}/{} | {} | {:.0} ({:.2}×) | {:.1} ms ({:.2}×) | {:.1} ms ({:.2}×) | {:.1} s ({:.2}×) | {} | {:.2} ms ({:.2}×) | {:.1} ms | {} | {} MiB | {} B | {} B |",
        row.store,
        row.size.nodes,
        row.size.sessions,
        row.running,
        row.size.sessions,
        row.missed,
        row.per_second,
        ratio(row.per_second, small.per_second),
        row.p50.as_secs_f64() * 1e3,
        ratio(row.p50.as_secs_f64(), small.p50.as_secs_f64()),
        row.p99.as_secs_f64() * 1e3,
        ratio(row.p99.as_secs_f64(), small.p99.as_secs_f64()),
        row.took,
        ratio(row.took, small.took),
        row.passes.0,
        mean_pass(row) * 1e3,
        ratio(mean_pass(row), mean_pass(small)),
        row.passes.2.as_secs_f64() * 1e3,
        row.heartbeats,
        rss >> 20,
        grew / row.size.nodes.max(1) as u64,
        grew / row.size.sessions.max(1) as u64,
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "\ncargo xtask bench e2e — {SESSIONS} sessions (0.1–0.5 GPU) created by {CLIENTS} clients, \
         {NODES} fake agents × {GPUS} GPUs acknowledging over real gRPC; create → RUNNING"
    );
    println!(
        "| store | commits | running | sessions/s | vs one change per commit | p50 create → RUNNING | p99 | commits / changes | floor |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---|");
    let dir = scratch("bench-e2e");
    let sled = |name: &str| StoreSpec::Sled(dir.path().join(name));
    let etcd = Etcd::start();
    let etcd_spec =
        |prefix: &str| -> StoreSpec { etcd.store_url(prefix).parse().expect("a store spec") };
    runtime.block_on(async {
        let open = |spec: StoreSpec| async move { Store::open(&spec).await.expect("store") };
        // The one-change-per-commit baselines can be left out when only the scale is wanted.
        let baselines = std::env::var_os("GPUWARDEN_BENCH_SCALE_ONLY").is_none();
        let base = if baselines {
            let base = run(open(sled("base")).await, "sled", false, BASE).await;
            print(&base, None, None);
            Some(base)
        } else {
            None
        };
        let sled_small = run(open(sled("grouped")).await, "sled", true, BASE).await;
        print(
            &sled_small,
            base.as_ref(),
            Some((5_000.0, Some(Duration::from_millis(50)))),
        );
        let base = if baselines {
            let base = run(open(etcd_spec("base")).await, "etcd", false, BASE).await;
            print(&base, None, None);
            Some(base)
        } else {
            None
        };
        let etcd_small = run(open(etcd_spec("grouped")).await, "etcd", true, BASE).await;
        print(&etcd_small, base.as_ref(), Some((1_000.0, None)));

        let size = scale();
        println!(
            "\n| scale (group commit) | nodes × sessions | running | watcher missed | sessions/s (vs {NODES} nodes) | p50 | p99 | create → last RUNNING | passes | mean pass | longest pass | heartbeats | RSS at the end | grown per node | grown per session |"
        );
        println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (label, small) in [("sled", &sled_small), ("etcd", &etcd_small)] {
            let store = match label {
                "sled" => open(sled("scale")).await,
                _ => open(etcd_spec("scale")).await,
            };
            let row = run(store, label, true, size).await;
            print_scale(&row, small);
        }
    });
    println!(
        "\n| failover (etcd, lease TTL {} s) | takeover after the leader is killed | floor |",
        TTL.as_secs()
    );
    println!("|---|---:|---|");
    for round in 1..=3 {
        let took = failover(&etcd_spec(&format!("failover{round}")), &runtime);
        let floor = TTL + Duration::from_secs(1);
        println!(
            "| round {round} | {:.2} s | ≤ {:.0} s: {} |",
            took.as_secs_f64(),
            floor.as_secs_f64(),
            if took <= floor { "met" } else { "NOT MET" }
        );
    }
}
