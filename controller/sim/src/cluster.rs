//! The simulated cluster: its nodes, and the ground truth of how tenants of a GPU behave and
//! slow each other.
//!
//! Everything here is hidden from the scheduler. It sees only what a real agent would report:
//! the utilization each tenant actually got (what NVML measures), and learns its class
//! profiles from that. The ground truth has two parts:
//!
//! - **Demand.** Each workload class has a utilization process ([`Behaviour`]): a two-state
//!   (busy / idle) Markov chain with a level drawn around each state's mean every tick, so a
//!   training job is busy most of the time with short dips, an online inference service is
//!   idle with bursts, a notebook is idle almost always.
//! - **Contention.** A device delivers at most 1.0. When the tenants' demands sum to `S > 1`,
//!   each gets `1/S` of what it asked for (time slicing). On top of that, a hidden penalty the
//!   co-location model doesn't know: tenants that run at the same time compete for memory
//!   bandwidth and cache, so tenant `i` progresses `1 + γ·βᵢ·Σⱼ βⱼ·dⱼ` times slower, where `β`
//!   is each class's memory intensity (0..1) and `dⱼ` what co-tenant `j` got this tick. The
//!   model the scorer uses predicts only the time-slicing part.
//!
//! A job progresses at `(delivered / demanded) / penalty` of its alone speed on each of its
//! devices (1 in an idle tick: its host-side work isn't slowed by the GPU), and a job on
//! several devices at the pace of its slowest one, so alone every job takes its `work`.

use gpuwarden_controller::node::NodeReport;

use super::rng::Rng;

/// Strength of the hidden memory-bandwidth/cache contention (assumed; see
/// `docs/simulation.md`): two memory-bound tenants (β = 0.8) each getting half a device slow
/// each other by a further 1 + 0.5 · 0.8 · 0.8 · 0.5 = 1.16×.
pub const GAMMA: f64 = 0.5;

/// The utilization process of a workload class (ground truth, hidden from the scheduler).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Behaviour {
    /// Fraction of ticks in the busy state.
    pub busy_fraction: f64,
    /// Mean length of a busy period, in ticks.
    pub busy_ticks: f64,
    /// Mean and spread of the demand while busy.
    pub busy: (f64, f64),
    /// Mean and spread of the demand while idle.
    pub idle: (f64, f64),
    /// Memory intensity β in 0..=1: how much it suffers from, and inflicts, contention.
    pub memory_intensity: f64,
}

/// The workload families of the generated traces, with their behaviours (assumed; the overall
/// mix is checked against published utilization figures in `docs/simulation.md`).
pub const FAMILIES: [(&str, Behaviour); 6] = [
    (
        "train",
        Behaviour {
            busy_fraction: 0.9,
            busy_ticks: 30.0,
            busy: (0.85, 0.08),
            idle: (0.15, 0.05),
            memory_intensity: 0.8,
        },
    ),
    (
        "finetune",
        Behaviour {
            busy_fraction: 0.85,
            busy_ticks: 20.0,
            busy: (0.7, 0.1),
            idle: (0.1, 0.05),
            memory_intensity: 0.7,
        },
    ),
    (
        "infer-online",
        Behaviour {
            busy_fraction: 0.25,
            busy_ticks: 3.0,
            busy: (0.7, 0.15),
            idle: (0.08, 0.04),
            memory_intensity: 0.5,
        },
    ),
    (
        "infer-batch",
        Behaviour {
            busy_fraction: 0.6,
            busy_ticks: 10.0,
            busy: (0.45, 0.1),
            idle: (0.05, 0.03),
            memory_intensity: 0.6,
        },
    ),
    (
        "notebook",
        Behaviour {
            busy_fraction: 0.08,
            busy_ticks: 6.0,
            busy: (0.6, 0.2),
            idle: (0.01, 0.01),
            memory_intensity: 0.4,
        },
    ),
    (
        "eval",
        Behaviour {
            busy_fraction: 0.5,
            busy_ticks: 5.0,
            busy: (0.35, 0.1),
            idle: (0.05, 0.03),
            memory_intensity: 0.3,
        },
    ),
];

/// Behaviour of classes no family claims (a class name of a hand-written trace): a middling,
/// half-busy workload.
pub const DEFAULT_BEHAVIOUR: Behaviour = Behaviour {
    busy_fraction: 0.5,
    busy_ticks: 10.0,
    busy: (0.6, 0.15),
    idle: (0.1, 0.05),
    memory_intensity: 0.5,
};

impl Behaviour {
    /// The behaviour of `class`: its family's (the name up to a last `-N` variant suffix), with
    /// the busy level shifted a little per variant (±0.06) so variants are not identical twins.
    #[must_use]
    pub fn of(class: &str) -> Self {
        let (family, variant) = class
            .rsplit_once('-')
            .and_then(|(f, v)| v.parse::<u32>().ok().map(|v| (f, v)))
            .unwrap_or((class, 0));
        let Some(base) = FAMILIES
            .iter()
            .find(|(name, _)| *name == family)
            .map(|(_, b)| *b)
        else {
            return DEFAULT_BEHAVIOUR;
        };
        // Variants 0, 1, 2, … shift by 0, +0.02, −0.02, +0.04, … up to ±0.06.
        let step = f64::from(variant % 7);
        let shift = if variant % 2 == 1 { 1.0 } else { -1.0 } * (step / 2.0).ceil() * 0.02;
        Self {
            busy: ((base.busy.0 + shift).clamp(0.05, 1.0), base.busy.1),
            ..base
        }
    }

    /// Mean demand (for documentation and the generator's load estimate).
    #[must_use]
    pub fn mean(&self) -> f64 {
        self.busy_fraction * self.busy.0 + (1.0 - self.busy_fraction) * self.idle.0
    }
}

/// One job's demand process: its behaviour, its random stream and its current state.
#[derive(Debug, Clone)]
pub struct Demand {
    behaviour: Behaviour,
    rng: Rng,
    busy: bool,
}

impl Demand {
    /// Starts a process for `class`, drawing from `rng`; the first state is drawn from the
    /// stationary distribution.
    #[must_use]
    pub fn new(class: &str, mut rng: Rng) -> Self {
        let behaviour = Behaviour::of(class);
        let busy = rng.unit() < behaviour.busy_fraction;
        Self {
            behaviour,
            rng,
            busy,
        }
    }

    /// The memory intensity of its class.
    #[must_use]
    pub fn memory_intensity(&self) -> f64 {
        self.behaviour.memory_intensity
    }

    /// The demand of the next tick (fraction of one device, 0..=1).
    pub fn draw(&mut self) -> f64 {
        let b = &self.behaviour;
        // Leave busy with 1/L; enter it so that the busy fraction is the stationary one.
        let leave = 1.0 / b.busy_ticks.max(1.0);
        let enter = if b.busy_fraction >= 1.0 {
            1.0
        } else {
            (b.busy_fraction * leave / (1.0 - b.busy_fraction)).min(1.0)
        };
        let flip = self.rng.unit();
        self.busy = if self.busy {
            flip >= leave
        } else {
            flip < enter
        };
        let (mean, spread) = if self.busy { b.busy } else { b.idle };
        (mean + spread * self.rng.normal()).clamp(0.0, 1.0)
    }
}

/// What one tenant of a device gets in a tick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share {
    /// Utilization delivered to it (what NVML would measure for it).
    pub delivered: f64,
    /// Its progress rate against running alone (1.0: alone speed).
    pub rate: f64,
    /// The part of `delivered` that made progress (`delivered / penalty`): what it would have
    /// used alone for the same progress.
    pub useful: f64,
}

/// The ground truth for one device in one tick: tenants given as `(demand, memory_intensity)`.
#[must_use]
pub fn contend(tenants: &[(f64, f64)]) -> Vec<Share> {
    let summed: f64 = tenants.iter().map(|(d, _)| d.max(0.0)).sum();
    let scale = if summed > 1.0 { 1.0 / summed } else { 1.0 };
    let delivered: Vec<f64> = tenants.iter().map(|(d, _)| d.max(0.0) * scale).collect();
    tenants
        .iter()
        .enumerate()
        .map(|(i, &(demand, beta))| {
            if demand <= 0.0 {
                return Share {
                    delivered: 0.0,
                    rate: 1.0,
                    useful: 0.0,
                };
            }
            let pressure: f64 = tenants
                .iter()
                .zip(&delivered)
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, ((_, beta_j), d_j))| beta_j * d_j)
                .sum();
            let penalty = 1.0 + GAMMA * beta * pressure;
            Share {
                delivered: delivered[i],
                rate: scale / penalty,
                useful: delivered[i] / penalty,
            }
        })
        .collect()
}

/// Shape of the simulated cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterShape {
    /// Nodes.
    pub nodes: u32,
    /// GPUs per node (two NUMA nodes, half each).
    pub gpus_per_node: u32,
}

impl ClusterShape {
    /// All GPUs.
    #[must_use]
    pub fn gpus(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }

    /// What each simulated agent reports when it registers.
    #[must_use]
    pub fn reports(&self) -> Vec<NodeReport> {
        let half = (self.gpus_per_node / 2).max(1);
        (0..self.nodes)
            .map(|n| NodeReport {
                agent_version: "sim".into(),
                ..NodeReport::with_gpus(&format!("sim-{n:03}"), self.gpus_per_node, 80 << 30, half)
            })
            .collect()
    }
}
