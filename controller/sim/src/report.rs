//! Metrics per placement mode, and the table (or JSON) that shows them as ratios against
//! `binpack` measured in the same run.

use std::fmt::Write as _;

use serde::Serialize;

use gpuwarden_controller::placement::Placement;

use super::run::{MigRun, ModeRun, warmup_count};

/// The figures of one mode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeReport {
    /// The mode.
    pub mode: Placement,
    /// Jobs measured (after the warm-up) that completed.
    pub completed: usize,
    /// Jobs refused at creation (all of the trace).
    pub rejected: usize,
    /// Mean job completion time (finish − arrival), s.
    pub mean_jct: f64,
    /// Mean work alone of the measured jobs, s: the mean completion time no placement can
    /// beat (no queueing, no interference).
    pub mean_work: f64,
    /// 95th-percentile job completion time, s.
    pub p95_jct: f64,
    /// Mean queueing delay (placement − arrival), s.
    pub mean_queueing: f64,
    /// Mean slowdown: completion time over the work alone.
    pub mean_slowdown: f64,
    /// Mean stretch: running time (finish − placement) over the work alone; above 1 only
    /// through interference.
    pub mean_stretch: f64,
    /// Time-average over the measured window and all devices of the utilization delivered
    /// (each device at most 1).
    pub mean_utilization: f64,
    /// The same for useful utilization: the delivered utilization that made progress (busy
    /// time lost to contention left out).
    pub mean_useful_utilization: f64,
    /// Time-average of the free shares on partly used devices.
    pub mean_fragmented_shares: f64,
    /// The same as a fraction of all shares.
    pub fragmented_fraction: f64,
    /// Measured jobs whose completion time exceeded the SLO factor × their work.
    pub slo_misses: usize,
    /// Classes with a learned profile at the end.
    pub learned_classes: usize,
    /// Virtual seconds until the last job finished.
    pub makespan: f64,
    /// The MIG nodes' figures (absent without MIG nodes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigReport>,
}

/// What happened on the MIG nodes in one mode (all of the trace, warm-up included).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MigReport {
    /// Jobs asking for a MIG profile (`cuda.mig.<profile>=1`) that became sessions.
    pub profile_requests: usize,
    /// Of those, placed.
    pub placed: usize,
    /// Their mean wait (placement − arrival), s.
    pub mean_wait: f64,
    /// Instances the controller ordered made (`MakeMigInstance`).
    pub orders: u64,
    /// Orders the simulated agent refused (a placement the hardware would refuse).
    pub refused: u64,
    /// Instances made on demand.
    pub made: u64,
    /// Instances destroyed once empty.
    pub destroyed: u64,
    /// Most instances made and not yet destroyed at once.
    pub peak_made: u64,
}

impl From<&MigRun> for MigReport {
    fn from(m: &MigRun) -> Self {
        Self {
            profile_requests: m.requests,
            placed: m.placed,
            mean_wait: m.wait_sum / m.placed.max(1) as f64,
            orders: m.orders,
            refused: m.refused,
            made: m.made,
            destroyed: m.destroyed,
            peak_made: m.peak_made,
        }
    }
}

/// All modes over one trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Jobs in the trace.
    pub jobs: usize,
    /// Jobs at the start excluded from the metrics (the warm-up).
    pub warmup_jobs: usize,
    /// Nodes × GPUs per node.
    pub cluster: (u32, u32),
    /// Of the nodes, those with their GPUs in MIG mode (left out of the JSON when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub mig_nodes: u32,
    /// A job misses its SLO when its completion time exceeds this × its work.
    pub slo_factor: f64,
    /// Seed of the simulated demand.
    pub seed: u64,
    /// One per mode, in [`Placement::ALL`] order.
    pub modes: Vec<ModeReport>,
}

impl ModeReport {
    /// Figures of one replay; `total_shares` is the cluster's share capacity.
    #[must_use]
    pub fn from_run(run: &ModeRun, warmup: f64, slo_factor: f64, total_shares: f64) -> Self {
        let skip = warmup_count(run.outcomes.len(), warmup);
        let measured: Vec<_> = run.outcomes.iter().skip(skip).flatten().collect();
        let mut jct: Vec<f64> = measured.iter().map(|o| o.finish - o.arrival).collect();
        jct.sort_by(f64::total_cmp);
        let n = measured.len().max(1) as f64;
        let ticks = run.measured_ticks.max(1) as f64;
        let fragmented = run.fragmented_sum / ticks;
        Self {
            mode: run.mode,
            completed: measured.len(),
            rejected: run.rejected.len(),
            mean_jct: jct.iter().sum::<f64>() / n,
            mean_work: measured.iter().map(|o| o.work).sum::<f64>() / n,
            p95_jct: percentile(&jct, 0.95),
            mean_queueing: measured.iter().map(|o| o.start - o.arrival).sum::<f64>() / n,
            mean_slowdown: measured
                .iter()
                .map(|o| (o.finish - o.arrival) / o.work)
                .sum::<f64>()
                / n,
            mean_stretch: measured
                .iter()
                .map(|o| (o.finish - o.start) / o.work)
                .sum::<f64>()
                / n,
            mean_utilization: run.utilization_sum / ticks,
            mean_useful_utilization: run.useful_sum / ticks,
            mean_fragmented_shares: fragmented,
            fragmented_fraction: fragmented / total_shares.max(1.0),
            slo_misses: measured
                .iter()
                .filter(|o| o.finish - o.arrival > slo_factor * o.work)
                .count(),
            learned_classes: run.learned_classes,
            makespan: run.makespan,
            mig: run.mig.as_ref().map(MigReport::from),
        }
    }
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The `p` quantile of sorted values (nearest rank).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a percentile's rank: non-negative and clamped to the length"
    )]
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

impl Report {
    /// The figures of `mode`, if it ran.
    #[must_use]
    pub fn mode(&self, mode: Placement) -> Option<&ModeReport> {
        self.modes.iter().find(|m| m.mode == mode)
    }

    /// The largest cut of `binpack`'s mean JCT that any placement could make: the share of it
    /// that is queueing or interference (the rest is the jobs' work alone).
    #[must_use]
    pub fn bound(&self) -> Option<f64> {
        let base = self.baseline()?;
        (base.mean_jct > 0.0).then(|| 1.0 - base.mean_work / base.mean_jct)
    }

    /// The baseline: `binpack`, or the first mode.
    fn baseline(&self) -> Option<&ModeReport> {
        self.modes
            .iter()
            .find(|m| m.mode == Placement::Binpack)
            .or_else(|| self.modes.first())
    }

    /// The table: absolute figures per mode, then ratios against `binpack`.
    #[must_use]
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} jobs ({} warm-up excluded), {} nodes × {} GPUs{}, demand seed {}, SLO: JCT > {}× work",
            self.jobs,
            self.warmup_jobs,
            self.cluster.0,
            self.cluster.1,
            if self.mig_nodes > 0 {
                format!(" ({} in MIG mode)", self.mig_nodes)
            } else {
                String::new()
            },
            self.seed,
            self.slo_factor
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "| mode | jobs | mean JCT (s) | p95 JCT (s) | mean queueing (s) | mean slowdown | mean stretch | mean GPU util | useful util | mean fragmentation (shares / fraction) | SLO misses |"
        );
        let _ = writeln!(
            out,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for m in &self.modes {
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.3} | {:.3} | {:.2} / {:.3} | {} ({:.1}%) |",
                m.mode,
                m.completed,
                m.mean_jct,
                m.p95_jct,
                m.mean_queueing,
                m.mean_slowdown,
                m.mean_stretch,
                m.mean_utilization,
                m.mean_useful_utilization,
                m.mean_fragmented_shares,
                m.fragmented_fraction,
                m.slo_misses,
                100.0 * m.slo_misses as f64 / m.completed.max(1) as f64,
            );
        }
        if self.modes.iter().any(|m| m.mig.is_some()) {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "| MIG ({} nodes) | profile requests | placed | mean wait (s) | instances ordered | refused | made | destroyed | most made at once |",
                self.mig_nodes
            );
            let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
            for m in &self.modes {
                let Some(g) = &m.mig else { continue };
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
                    m.mode,
                    g.profile_requests,
                    g.placed,
                    g.mean_wait,
                    g.orders,
                    g.refused,
                    g.made,
                    g.destroyed,
                    g.peak_made,
                );
            }
        }
        if let Some(base) = self.baseline() {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "| vs {} | mean JCT | p95 JCT | mean queueing | mean GPU util | useful util | mean fragmentation | SLO misses |",
                base.mode
            );
            let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
            for m in &self.modes {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    m.mode,
                    ratio(m.mean_jct, base.mean_jct),
                    ratio(m.p95_jct, base.p95_jct),
                    ratio(m.mean_queueing, base.mean_queueing),
                    ratio(m.mean_utilization, base.mean_utilization),
                    ratio(m.mean_useful_utilization, base.mean_useful_utilization),
                    ratio(m.mean_fragmented_shares, base.mean_fragmented_shares),
                    ratio(m.slo_misses as f64, base.slo_misses as f64),
                );
            }
            let _ = write!(out, "{}", self.floors(base));
        }
        out
    }

    /// Issue #6's floors, met or not, and how much any placement could gain over `base`.
    fn floors(&self, base: &ModeReport) -> String {
        let find = |mode| self.modes.iter().find(|m| m.mode == mode);
        let (Some(aware), Some(spread)) =
            (find(Placement::InterferenceAware), find(Placement::Spread))
        else {
            return String::new();
        };
        let verdict = |ok: bool| if ok { "met" } else { "NOT MET" };
        let jct = aware.mean_jct / base.mean_jct.max(f64::MIN_POSITIVE);
        let util = aware.mean_utilization / base.mean_utilization.max(f64::MIN_POSITIVE);
        let frag =
            aware.mean_fragmented_shares / spread.mean_fragmented_shares.max(f64::MIN_POSITIVE);
        let mut out = String::new();
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "floors: interference-aware vs {}: mean JCT {jct:.2}× (≤ 0.90×: {}), mean GPU util {util:.2}× (≥ 0.95×: {}); vs spread: fragmentation {frag:.2}× (< 1.00×: {})",
            base.mode,
            verdict(jct <= 0.90),
            verdict(util >= 0.95),
            verdict(frag < 1.0)
        );
        let _ = writeln!(
            out,
            "bound: the measured jobs' mean work alone is {:.0} s; {}'s mean JCT is {:.2}× that, so no placement can cut it by more than {:.1}%",
            base.mean_work,
            base.mode,
            base.mean_jct / base.mean_work.max(f64::MIN_POSITIVE),
            100.0 * (1.0 - base.mean_work / base.mean_jct.max(f64::MIN_POSITIVE)),
        );
        out
    }
}

fn ratio(x: f64, base: f64) -> String {
    if base == 0.0 {
        if x == 0.0 {
            "1.00×".into()
        } else {
            "—".into()
        }
    } else {
        format!("{:.2}×", x / base)
    }
}

/// One line per trace of a sweep: how `interference-aware` fares against `binpack` and
/// `spread`, and how much of the bound it takes. `rows` pairs each trace's parameter value
/// (named `parameter` in the header) with its report.
#[must_use]
pub fn sweep_table(parameter: &str, rows: &[(f64, Report)]) -> String {
    let mut out = format!(
        "| {parameter} | binpack stretch | bound on the JCT cut | interference-aware JCT vs binpack | captured | GPU util vs binpack | fragmentation vs spread | SLO misses (aware vs binpack) |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for (value, report) in rows {
        let (Some(base), Some(spread), Some(aware), Some(bound)) = (
            report.mode(Placement::Binpack),
            report.mode(Placement::Spread),
            report.mode(Placement::InterferenceAware),
            report.bound(),
        ) else {
            continue;
        };
        let cut = 1.0 - aware.mean_jct / base.mean_jct.max(f64::MIN_POSITIVE);
        let captured = if bound > 0.0 {
            format!("{:.0} %", 100.0 * cut / bound)
        } else {
            "—".to_owned()
        };
        let _ = writeln!(
            out,
            "| {value} | {:.2} | {:.1} % | {} | {captured} | {} | {} | {} vs {} |",
            base.mean_stretch,
            100.0 * bound,
            ratio(aware.mean_jct, base.mean_jct),
            ratio(aware.mean_utilization, base.mean_utilization),
            ratio(aware.mean_fragmented_shares, spread.mean_fragmented_shares),
            aware.slo_misses,
            base.slo_misses,
        );
    }
    out
}
