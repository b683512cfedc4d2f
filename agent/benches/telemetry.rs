//! `cargo xtask bench telemetry`: how long a snapshot waits while the telemetry is flooded with
//! kernel events, with telemetry shared as it was (one `std::sync::Mutex`, held on the runtime's
//! worker threads while `/proc/<pid>/fd` is read) and as it is (a task behind a handle, its
//! blocking work on blocking threads), measured in the same run on the same loaded programs.
//!
//! The storm: batches of exec events for this process, which holds [`FDS`] extra open files, so
//! each event re-reads a long `/proc/<pid>/fd` as an exec of a real GPU process does. Snapshots
//! are asked for every [`EVERY`] meanwhile; the table gives their latency idle and under the
//! storm (p50, p99, max) and how many exec events per second were handled meanwhile. Needs root
//! (it loads the eBPF programs).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use gpuwarden_agent::bench::{Design, Rig};

/// Extra open files this process holds, which each exec event's re-read goes through.
const FDS: usize = 500;
/// Exec events per batch, as the ring buffer hands them over under load.
const BATCH: usize = 32;
/// How often a snapshot is asked for.
const EVERY: Duration = Duration::from_millis(10);
/// How long each phase runs.
const IDLE: Duration = Duration::from_secs(1);
const STORM: Duration = Duration::from_secs(4);

/// Latencies of one phase, sorted.
struct Latencies(Vec<Duration>);

impl Latencies {
    fn at(&self, percentile: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let rank = (percentile / 100.0 * (self.0.len() - 1) as f64).round();
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a rank in 0..len, rounded"
        )]
        self.0[rank as usize]
    }

    fn max(&self) -> Duration {
        self.0.last().copied().unwrap_or_default()
    }
}

/// Asks for snapshots every [`EVERY`] for `how_long`.
async fn sample(rig: &Rig, how_long: Duration) -> Latencies {
    let mut ticker = tokio::time::interval(EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = Instant::now() + how_long;
    let mut latencies = Vec::new();
    while Instant::now() < end {
        ticker.tick().await;
        let start = Instant::now();
        std::hint::black_box(rig.snapshot().await);
        latencies.push(start.elapsed());
    }
    latencies.sort();
    Latencies(latencies)
}

struct Row {
    design: Design,
    idle: Latencies,
    storm: Latencies,
    execs_per_sec: f64,
}

async fn measure(design: Design) -> anyhow::Result<Row> {
    let rig = Arc::new(Rig::start(design)?);
    let idle = sample(&rig, IDLE).await;
    let stop = Arc::new(AtomicBool::new(false));
    let execs = Arc::new(AtomicU64::new(0));
    let pid = std::process::id();
    let storm = tokio::spawn({
        let (rig, stop, execs) = (Arc::clone(&rig), Arc::clone(&stop), Arc::clone(&execs));
        async move {
            while !stop.load(Ordering::Relaxed) {
                rig.events(BATCH as u64, vec![pid; BATCH]).await;
                execs.fetch_add(BATCH as u64, Ordering::Relaxed);
                // The event reader awaits the ring buffer between batches.
                tokio::task::yield_now().await;
            }
        }
    });
    let started = Instant::now();
    let under_storm = sample(&rig, STORM).await;
    stop.store(true, Ordering::Relaxed);
    storm.await?;
    // Until the events handed over are handled: the rate is of events handled.
    rig.settled().await;
    let elapsed = started.elapsed();
    let handed = execs.load(Ordering::Relaxed);
    if let Ok(rig) = Arc::try_unwrap(rig) {
        rig.stop().await;
    }
    Ok(Row {
        design,
        idle,
        storm: under_storm,
        execs_per_sec: handed as f64 / elapsed.as_secs_f64(),
    })
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn main() -> anyhow::Result<()> {
    // cargo bench passes `--bench`; nothing here takes options.
    // SAFETY: a plain syscall without arguments.
    anyhow::ensure!(
        unsafe { libc::geteuid() } == 0,
        "the telemetry bench loads the eBPF programs: it needs root"
    );
    let _held: Vec<std::fs::File> = (0..FDS)
        .map(|_| std::fs::File::open("/dev/null"))
        .collect::<Result<_, _>>()?;
    // The agent's own runtime: one worker per CPU.
    let runtime = tokio::runtime::Runtime::new()?;
    let rows = runtime.block_on(async {
        let mut rows = Vec::new();
        for design in [Design::Mutex, Design::Task] {
            rows.push(measure(design).await?);
        }
        anyhow::Ok(rows)
    })?;
    println!(
        "snapshot latency (ms) under a storm of exec events ({BATCH} per batch, {FDS} extra fds \
         each), one snapshot asked every {} ms; {} CPUs",
        EVERY.as_millis(),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    println!(
        "{:<26} {:>9} {:>9} {:>10} {:>10} {:>10} {:>11} {:>8}",
        "telemetry",
        "idle p50",
        "idle p99",
        "storm p50",
        "storm p99",
        "storm max",
        "execs/s",
        "samples"
    );
    for row in &rows {
        let name = match row.design {
            Design::Mutex => "mutex (before)",
            Design::Task => "task behind a handle (now)",
        };
        println!(
            "{:<26} {:>9} {:>9} {:>10} {:>10} {:>10} {:>11.0} {:>8}",
            name,
            ms(row.idle.at(50.0)),
            ms(row.idle.at(99.0)),
            ms(row.storm.at(50.0)),
            ms(row.storm.at(99.0)),
            ms(row.storm.max()),
            row.execs_per_sec,
            row.storm.0.len(),
        );
    }
    if let [before, now] = &rows[..] {
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
        println!(
            "storm p99, before over now: {:.1}×; p50: {:.1}×",
            ratio(before.storm.at(99.0), now.storm.at(99.0)),
            ratio(before.storm.at(50.0), now.storm.at(50.0)),
        );
    }
    Ok(())
}
