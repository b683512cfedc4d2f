//! Exclusive slots: each GPU's time is cut into slots, and in each slot at most one bound cgroup
//! per GPU is thawed. The GPU's own busy time in a slot then belongs to that slot's holder, so
//! nothing is apportioned by per-process samples.
//!
//! - **Boundaries** fall where the signal closes its spans: with NVML's device samples, a guard's
//!   half after each predicted sample, so that a sample's span holds one slot's work; with a
//!   signal the agent reads when it likes (GPM, the CPU-time stand-in), every
//!   [`SlotConfig::slot`].
//! - **Guard.** A holder whose next slot is another's is frozen [`SlotConfig::guard`] before its
//!   slot ends, so that the work it queued drains inside its own slot (a GPU runs what was
//!   submitted after the process is frozen). A holder that keeps the next slot is not frozen.
//! - **A ledger, not gains.** Per cgroup and GPU, `entitled × elapsed − used`: a slot is charged
//!   its whole length when it starts ([`Charge::Held`], the default: a share is that share of the
//!   GPU's time, so a tenant gets that share of what it does alone); with [`Charge::Busy`] the
//!   difference to the measured busy time is settled once the signal has covered the slot. Among
//!   the cgroups owed time, the next slot goes to the one with the least virtual time (charged
//!   time over share: stride scheduling), so a GPU that delivers less than the shares add up to
//!   shortens each in proportion. Credit is capped at one slot, so idle time banks no burst;
//!   debt at ten.
//! - **Policies.** `hard` leaves a slot idle when nobody is owed one; `work-conserving` passes it
//!   to a cgroup that is not owed, uncharged.
//! - **Idle cgroups cost nothing.** A cgroup starts idle, and one whose slot showed it (almost)
//!   idle turns idle again: it is left thawed and given no slots until its processes show
//!   activity (the signal's per-process samples, or its own CPU time), when it joins with an
//!   empty ledger.
//! - **Several GPUs.** One slot clock for the node: a cgroup bound on several GPUs holds slots on
//!   all of them at once, or none.
//! - **A GPU that measures nothing** ([`DeviceReading::time_only`]: a MIG instance, where NVML
//!   keeps no utilization samples) is held by time alone: its slots are charged as held whatever
//!   [`Charge`] says, and a holder turns idle when its own CPU time showed no activity in its
//!   slot (a process feeding a GPU runs on a CPU too), not by the GPU's busy time.
//!
//! Pure like `control.rs`: time is passed in, the signal and the freezer come through
//! [`SlotKernel`], so tests drive it on a model GPU in simulated time.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    io,
    path::Path,
    time::{Duration, Instant},
};

use super::{
    ComputePolicy, DeviceReading, Member, ThrottleStats,
    freezer::{self, Cgroup, Freezer},
};

/// The kernel side of the slot throttle: the GPU's busy time and the cgroups' freezers.
pub(crate) trait SlotKernel: Freezer {
    /// See [`super::DeviceSignal::read`].
    fn read(&mut self, gpu: u32, cgroups: &[&Path]) -> io::Result<DeviceReading>;
}

/// How slots are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotConfig {
    /// A slot's length where the signal has no rhythm of its own; where it has one, a slot is
    /// the whole number of its periods nearest this.
    pub slot: Duration,
    /// How long before its slot ends a holder whose next slot is another's is frozen.
    pub guard: Duration,
    /// What a slot costs its holder.
    pub charge: Charge,
}

impl Default for SlotConfig {
    /// 120 ms slots, a 3 ms guard (2.5 % of a slot at a switch), charged as held.
    fn default() -> Self {
        Self {
            slot: Duration::from_millis(120),
            guard: Duration::from_millis(3),
            charge: Charge::Held,
        }
    }
}

/// What a slot costs its holder's ledger (`throttle_charge` in the agent's configuration).
///
/// A workload rarely keeps a GPU busy all the time it holds it: the H200's matmul loop, which
/// synchronizes every ten kernels, kept it 96.7 % busy alone. Charged by busy time, a tenant at
/// 0.9 was given slots until it had been busy 0.9 of the time, 93 % of the time it had alone
/// (gpu-check, 2026-11-28); charged by the slots it holds, it gets 0.9 of the GPU's time and so
/// 0.9 of what it does alone, the way a time-sliced vGPU's fixed share does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Charge {
    /// A slot's whole length, used or not.
    #[default]
    Held,
    /// The GPU's busy time the signal measured in the slot (the first slots' way).
    Busy,
}

/// A holder whose slot showed less than this fraction of it busy is idle.
const IDLE_FRACTION: f64 = 0.05;

/// Credit is capped at this many slots, debt at [`MAX_DEBT_SLOTS`].
const MAX_CREDIT_SLOTS: u32 = 1;
const MAX_DEBT_SLOTS: u32 = 10;

/// A slot the signal has not covered this long after it ended is settled with what was measured.
const SETTLE_AFTER: Duration = Duration::from_secs(1);

/// Slots follow the signal's rhythm where its period is at most this many slots.
const ALIGN_UP_TO: f64 = 2.0;

/// The shortest slot, whatever the signal's period.
const MIN_SLOT: Duration = Duration::from_millis(20);

const PPM: i128 = 1_000_000;

/// One cgroup's ledger on one GPU.
#[derive(Debug)]
struct Account {
    share_ppm: u32,
    policy: ComputePolicy,
    /// Entitled minus used, in nanoseconds; positive is time owed to the cgroup.
    balance: i64,
    /// Entitlement counted up to here.
    accrued_to: Option<Instant>,
    /// Takes part in the slots; an idle cgroup is left thawed instead.
    active: bool,
    /// Busy time measured in its slots (charged or not).
    gpu_time: Duration,
    /// Its recent fraction of the GPU's time (an exponential average over about a second).
    recent: f64,
    /// Its virtual time: charged GPU time over its share, in seconds. Among cgroups that are
    /// owed time the one with the least goes first, so a GPU that delivers less than the shares
    /// add up to (switches, a guard) shortens each in proportion to its share.
    pass: f64,
}

impl Account {
    fn new(member: &Member) -> Self {
        Self {
            share_ppm: member.share_ppm,
            policy: member.policy,
            balance: 0,
            accrued_to: None,
            // Until its processes show activity: a cgroup that never touches its GPU is never
            // frozen (nor left frozen by an agent killed meanwhile).
            active: false,
            gpu_time: Duration::ZERO,
            recent: 0.0,
            pass: 0.0,
        }
    }

    /// Moves its virtual time by `ns` of charged GPU time (negative: a charge taken back).
    fn advance(&mut self, ns: i64) {
        let share = f64::from(self.share_ppm.max(1)) / 1e6;
        self.pass += seconds(ns) / share;
    }

    fn of_share(&self, d: Duration) -> i64 {
        let ns =
            i128::try_from(d.as_nanos()).unwrap_or(i128::MAX) * i128::from(self.share_ppm) / PPM;
        i64::try_from(ns).unwrap_or(i64::MAX)
    }

    fn accrue(&mut self, now: Instant, slot: Duration) {
        if let Some(from) = self.accrued_to {
            let earned = self.of_share(now.saturating_duration_since(from));
            self.balance = self.balance.saturating_add(earned);
        }
        self.accrued_to = Some(now);
        self.clamp(slot);
    }

    fn clamp(&mut self, slot: Duration) {
        let ns = |n: u32| i64::try_from((slot * n).as_nanos()).unwrap_or(i64::MAX);
        self.balance = self
            .balance
            .clamp(-ns(MAX_DEBT_SLOTS), ns(MAX_CREDIT_SLOTS));
    }
}

/// Who held one GPU from `start` to `end`, and what the signal measured of it.
#[derive(Debug)]
struct Window {
    start: Instant,
    /// `None` while it lasts.
    end: Option<Instant>,
    holder: Option<u64>,
    /// Charged to the holder's ledger (not a work-conserving gift).
    charged: bool,
    /// What was charged when it started.
    estimate: Duration,
    measured: Duration,
    /// The holder showed activity while it held the slot (read on a time-only GPU).
    seen_active: bool,
}

/// One GPU: its members' ledgers and the slots not yet settled.
#[derive(Debug, Default)]
struct Gpu {
    accounts: BTreeMap<u64, Account>,
    windows: VecDeque<Window>,
    /// The signal has closed the GPU's time up to here.
    covered: Option<Instant>,
    /// Busy time in no one's slot (before the first slot, in idle slots, past a slot's settling).
    unattributed: Duration,
    /// The signal measures no busy time here: shares are held by time alone.
    time_only: bool,
    /// When the signal was last read.
    last_read: Option<Instant>,
}

impl Gpu {
    /// Splits a span's busy time among the held slots it overlaps, in proportion to the overlap
    /// (a slot that lines up with the signal's spans, a guard's gap on either side, gets its span
    /// whole); where the span also covers slots no one held, each takes at most its overlap and
    /// what is left is unattributed.
    fn attribute(&mut self, start: Instant, end: Instant, busy: Duration) {
        let span = end.saturating_duration_since(start);
        if span.is_zero() {
            return;
        }
        let overlap = |w: &Window| {
            let from = w.start.max(start);
            let to = w.end.map_or(end, |e| e.min(end));
            to.saturating_duration_since(from)
        };
        let held: Vec<(usize, Duration)> = self
            .windows
            .iter()
            .enumerate()
            .filter(|(_, w)| w.holder.is_some_and(|h| self.accounts.contains_key(&h)))
            .map(|(i, w)| (i, overlap(w)))
            .filter(|(_, ov)| !ov.is_zero())
            .collect();
        let total: Duration = held.iter().map(|(_, ov)| *ov).sum();
        let mut given = Duration::ZERO;
        let mut parts: BTreeMap<u64, Duration> = BTreeMap::new();
        // Where held slots cover the whole span, all its busy time is theirs (a signal that
        // accounts late, as the kernel's CPU time does by up to a scheduler tick, may show more
        // than the span); where they don't, each takes at most its overlap.
        let whole = total >= span;
        for (i, ov) in held {
            let part = busy.mul_f64(ov.as_secs_f64() / total.as_secs_f64());
            let part = if whole { part } else { part.min(ov) };
            let w = &mut self.windows[i];
            w.measured += part;
            given += part;
            if let Some(holder) = w.holder {
                *parts.entry(holder).or_default() += part;
            }
        }
        let alpha = 1.0 - (-span.as_secs_f64()).exp();
        for (key, account) in &mut self.accounts {
            let part = parts.get(key).copied().unwrap_or_default();
            account.gpu_time += part;
            account.recent += alpha * (part.as_secs_f64() / span.as_secs_f64() - account.recent);
        }
        self.unattributed += busy.saturating_sub(given);
        self.covered = Some(self.covered.map_or(end, |c| c.max(end)));
    }

    /// Marks the slots `key` held within `(since, now]` as used: on a time-only GPU, its
    /// processes showed activity there.
    fn saw_active(&mut self, key: u64, since: Option<Instant>, now: Instant) {
        for w in &mut self.windows {
            let overlaps = w.start <= now && w.end.is_none_or(|e| since.is_none_or(|s| e > s));
            if w.holder == Some(key) && overlaps {
                w.seen_active = true;
            }
        }
    }

    /// The least virtual time among its active cgroups (0 with none).
    fn least_pass(&self) -> f64 {
        self.accounts
            .values()
            .filter(|a| a.active)
            .map(|a| a.pass)
            .reduce(f64::min)
            .unwrap_or(0.0)
    }

    /// Settles the slots the signal has covered (or given up on): the ledger is corrected from
    /// the estimate to what was measured, and a holder that hardly used its slot turns idle.
    fn settle(&mut self, now: Instant, slot: Duration, charge: Charge) {
        while let Some(w) = self.windows.front() {
            let Some(end) = w.end else { break };
            let covered = self.covered.is_some_and(|c| c >= end);
            if !covered && now.saturating_duration_since(end) < SETTLE_AFTER {
                break;
            }
            let Some(w) = self.windows.pop_front() else {
                break;
            };
            let Some(account) = w.holder.and_then(|h| self.accounts.get_mut(&h)) else {
                continue;
            };
            // A time-only GPU measured nothing to settle: its slots stay charged as held.
            if w.charged && charge == Charge::Busy && !self.time_only {
                let back = i64::try_from(w.estimate.as_nanos()).unwrap_or(i64::MAX)
                    - i64::try_from(w.measured.as_nanos()).unwrap_or(i64::MAX);
                account.balance = account.balance.saturating_add(back);
                account.advance(-back);
                account.clamp(slot);
            }
            let length = end.saturating_duration_since(w.start);
            let idle = if self.time_only {
                !w.seen_active
            } else {
                w.measured.as_secs_f64() < IDLE_FRACTION * length.as_secs_f64()
            };
            if idle {
                account.active = false;
                account.balance = account.balance.min(0);
            }
        }
    }
}

/// Every bound cgroup, its GPUs' slots and what the throttle has done to it.
#[derive(Debug)]
pub(crate) struct Scheduler {
    config: SlotConfig,
    gpus: BTreeMap<u32, Gpu>,
    cgroups: HashMap<u64, Cgroup>,
    /// When the current slot ends; `None` before the first.
    slot_end: Option<Instant>,
    /// The current slot's holders, charged or not.
    holders: BTreeSet<u64>,
    /// The next slot's holders (GPU → holder, charged), once decided at the guard.
    next: Option<BTreeMap<u32, (u64, bool)>>,
    /// The signal's rhythm (next close, period) from the first GPU that has one.
    rhythm: Option<(Instant, Duration)>,
}

impl Scheduler {
    pub(crate) fn new(config: SlotConfig) -> Self {
        Self {
            config,
            gpus: BTreeMap::new(),
            cgroups: HashMap::new(),
            slot_end: None,
            holders: BTreeSet::new(),
            next: None,
            rhythm: None,
        }
    }

    /// Adds `key` to `gpu`, or updates its share and policy there (keeping its ledger).
    pub(crate) fn set(&mut self, gpu: u32, key: u64, member: &Member) {
        freezer::member(&mut self.cgroups, key, &member.cgroup_dir);
        self.gpus
            .entry(gpu)
            .or_default()
            .accounts
            .entry(key)
            .and_modify(|a| {
                a.share_ppm = member.share_ppm;
                a.policy = member.policy;
            })
            .or_insert_with(|| Account::new(member));
        // A newcomer starts level with the others, not behind them by all they have run.
        let gpu_state = self.gpus.entry(gpu).or_default();
        let floor = gpu_state
            .accounts
            .iter()
            .filter(|(k, a)| **k != key && a.active)
            .map(|(_, a)| a.pass)
            .reduce(f64::min)
            .unwrap_or(0.0);
        if let Some(account) = gpu_state.accounts.get_mut(&key) {
            account.pass = account.pass.max(floor);
        }
    }

    /// Holds cgroup `key` frozen whatever its slots, or lets them decide again.
    pub(crate) fn hold(
        &mut self,
        key: u64,
        dir: &Path,
        held: bool,
        now: Instant,
        sys: &mut dyn Freezer,
    ) {
        let cgroup = self
            .cgroups
            .entry(key)
            .or_insert_with(|| Cgroup::new(dir.to_owned()));
        cgroup.held = held;
        let frozen = held || self.wants_frozen(key, now);
        if let Some(cgroup) = self.cgroups.get_mut(&key)
            && cgroup.apply(now, frozen, sys).is_err()
        {
            self.cgroups.remove(&key);
            self.forget(key);
        }
    }

    /// Drops `key` from every GPU and thaws it.
    pub(crate) fn remove(&mut self, key: u64, now: Instant, sys: &mut dyn Freezer) {
        self.forget(key);
        freezer::release(&mut self.cgroups, key, now, sys);
    }

    /// Thaws every cgroup (on shutdown).
    pub(crate) fn thaw_all(&mut self, now: Instant, sys: &mut dyn Freezer) {
        freezer::thaw_all(&mut self.cgroups, now, sys);
    }

    fn forget(&mut self, key: u64) {
        for gpu in self.gpus.values_mut() {
            gpu.accounts.remove(&key);
        }
        self.gpus
            .retain(|_, gpu| !gpu.accounts.is_empty() || !gpu.windows.is_empty());
        self.holders.remove(&key);
        if let Some(next) = &mut self.next {
            next.retain(|_, (holder, _)| *holder != key);
        }
    }

    /// When the loop must act next (the guard, or the slot's end), beyond its regular ticks.
    pub(crate) fn next_event(&self) -> Option<Instant> {
        let end = self.slot_end?;
        Some(if self.next.is_none() {
            end.checked_sub(self.config.guard).unwrap_or(end)
        } else {
            end
        })
    }

    /// Reads the signal, settles the ledger, moves to the next slot when one is due, and
    /// freezes or thaws each cgroup accordingly.
    pub(crate) fn tick(&mut self, now: Instant, sys: &mut dyn SlotKernel) {
        // A guard or a slot's end that is due acts before the signal is read: a read can take
        // milliseconds (NVML's), and a switch that waited for it would leave the GPU idle.
        if self.slot_end.is_some() && self.advance(now) {
            self.apply_all(now, sys);
        }
        let gone = self.measure(now, sys);
        for key in gone {
            if let Some(cgroup) = self.cgroups.remove(&key) {
                tracing::debug!(cgroup = %cgroup.dir.display(), key, "throttle: cgroup is gone; dropped");
            }
            self.forget(key);
        }
        let slot = self.slot_length();
        for gpu in self.gpus.values_mut() {
            for account in gpu.accounts.values_mut() {
                account.accrue(now, slot);
            }
            gpu.settle(now, slot, self.config.charge);
        }
        self.advance(now);
        self.apply_all(now, sys);
    }

    /// Chooses the next slot's holders at the guard, and starts the next slot at the current
    /// one's end (or the first one); whether anything moved.
    fn advance(&mut self, now: Instant) -> bool {
        match self.slot_end {
            None => {
                self.start_slot(now);
                true
            }
            Some(end) => {
                let mut moved = false;
                if self.next.is_none() && now + self.config.guard >= end {
                    self.next = Some(self.choose());
                    moved = true;
                }
                if now >= end {
                    self.start_slot(now);
                    moved = true;
                }
                moved
            }
        }
    }

    /// Reads every GPU's signal into its slots; returns the cgroups that are gone.
    fn measure(&mut self, now: Instant, sys: &mut dyn SlotKernel) -> Vec<u64> {
        let mut gone = Vec::new();
        let mut rhythm = None;
        for (&gpu, state) in &mut self.gpus {
            let keys: Vec<u64> = state.accounts.keys().copied().collect();
            let dirs: Vec<&Path> = keys
                .iter()
                .filter_map(|k| self.cgroups.get(k).map(|c| c.dir.as_path()))
                .collect();
            if dirs.len() != keys.len() {
                continue;
            }
            let reading = match sys.read(gpu, &dirs) {
                Ok(reading) => reading,
                Err(e) => {
                    if let Some(cgroup) = keys.first().and_then(|k| self.cgroups.get_mut(k)) {
                        cgroup.warn_once("reading the GPU's busy time", &e);
                    }
                    continue;
                }
            };
            gone.extend(reading.gone.iter().filter_map(|&i| keys.get(i)));
            for interval in &reading.intervals {
                state.attribute(interval.start, interval.end, interval.busy);
            }
            state.time_only = reading.time_only;
            if reading.time_only {
                let since = state.last_read;
                for (key, active) in keys.iter().zip(&reading.active) {
                    if *active {
                        state.saw_active(*key, since, now);
                    }
                }
                // The cgroups' CPU time is read up to now: the slots before are settled.
                state.covered = Some(now);
            }
            state.last_read = Some(now);
            let floor = state.least_pass();
            for (key, active) in keys.iter().zip(&reading.active) {
                if let Some(account) = state.accounts.get_mut(key)
                    && *active
                    && !account.active
                {
                    // Back from idle: it rejoins the slots with an empty ledger, level with the
                    // others (idle time is not a claim on their slots).
                    account.active = true;
                    account.balance = 0;
                    account.accrued_to = Some(now);
                    account.pass = account.pass.max(floor);
                }
            }
            if rhythm.is_none() {
                rhythm = reading.next_close.zip(reading.period);
            }
        }
        if rhythm.is_some() {
            self.rhythm = rhythm;
        }
        gone
    }

    /// The signal's rhythm, where slots follow it: a period at most twice a slot (a slower
    /// signal would make slots too coarse for small shares; slots then split its spans by
    /// overlap, which charges a slot for its neighbours' work). The H200's samples come every
    /// 200 ms (recorded by gpu-check), so its slots are one period each.
    fn aligned_rhythm(&self) -> Option<(Instant, Duration)> {
        self.rhythm.filter(|(_, p)| {
            !p.is_zero() && p.as_secs_f64() <= ALIGN_UP_TO * self.config.slot.as_secs_f64()
        })
    }

    /// A slot's length: the whole number of the signal's periods nearest the configured slot,
    /// or the configured slot.
    fn slot_length(&self) -> Duration {
        match self.aligned_rhythm() {
            Some((_, period)) => {
                let n = (self.config.slot.as_secs_f64() / period.as_secs_f64())
                    .round()
                    .max(1.0);
                period.mul_f64(n).max(MIN_SLOT)
            }
            None => self.config.slot,
        }
    }

    /// Where the slot starting at `start` ends: a guard's half after the signal's close nearest
    /// a slot's length from `start`, or a slot's length from `start`.
    fn slot_end_after(&self, start: Instant) -> Instant {
        let slot = self.slot_length();
        let Some((close, period)) = self.aligned_rhythm() else {
            return start + slot;
        };
        let half = self.config.guard / 2;
        let target = start + slot;
        // Closes are `close + n × period` (n may be negative when the reading is old).
        let offset = target.saturating_duration_since(close).as_secs_f64()
            - close.saturating_duration_since(target).as_secs_f64();
        let n = (offset / period.as_secs_f64()).round();
        let nearest = if n >= 0.0 {
            close + period.mul_f64(n)
        } else {
            close.checked_sub(period.mul_f64(-n)).unwrap_or(close)
        };
        let end = nearest + half;
        if end <= start + MIN_SLOT {
            end + period
        } else {
            end
        }
    }

    /// The next slot's holders: among the cgroups owed time, the one with the least virtual time
    /// first, each on all its GPUs; then, on GPUs left free, work-conserving cgroups uncharged.
    fn choose(&self) -> BTreeMap<u32, (u64, bool)> {
        // Per cgroup: its least-owed GPU's balance (`hard` exceeds on none), its most-served
        // GPU's virtual time, its GPUs, and whether it is work-conserving on all of them.
        struct Standing {
            balance: i64,
            pass: f64,
            gpus: Vec<u32>,
            work_conserving: bool,
            active: bool,
        }
        let mut standing: BTreeMap<u64, Standing> = BTreeMap::new();
        for (&gpu, state) in &self.gpus {
            for (&key, account) in &state.accounts {
                let entry = standing.entry(key).or_insert(Standing {
                    balance: i64::MAX,
                    pass: f64::MIN,
                    gpus: Vec::new(),
                    work_conserving: true,
                    active: true,
                });
                entry.balance = entry.balance.min(account.balance);
                entry.pass = entry.pass.max(account.pass);
                entry.gpus.push(gpu);
                entry.work_conserving &= account.policy == ComputePolicy::WorkConserving;
                entry.active &= account.active;
            }
        }
        let mut order: Vec<(u64, Standing)> = standing
            .into_iter()
            .filter(|(key, s)| s.active && self.cgroups.get(key).is_some_and(|c| !c.held))
            .collect();
        order.sort_by(|(ka, a), (kb, b)| {
            a.pass
                .total_cmp(&b.pass)
                .then(b.balance.cmp(&a.balance))
                .then(ka.cmp(kb))
        });
        let mut chosen: BTreeMap<u32, (u64, bool)> = BTreeMap::new();
        for charged in [true, false] {
            for (key, s) in &order {
                let eligible = if charged {
                    s.balance > 0
                } else {
                    s.work_conserving
                };
                if !eligible
                    || s.gpus.iter().any(|g| chosen.contains_key(g))
                    || chosen.values().any(|(k, _)| k == key)
                {
                    continue;
                }
                for gpu in &s.gpus {
                    chosen.insert(*gpu, (*key, charged));
                }
            }
        }
        chosen
    }

    /// Ends the current slot and starts the next at `now` (deciding it now if the guard did not).
    fn start_slot(&mut self, now: Instant) {
        let at = now;
        let next = match self.next.take() {
            Some(next) => next,
            None => self.choose(),
        };
        let end = self.slot_end_after(at);
        let slot = end.saturating_duration_since(at);
        for (&gpu, state) in &mut self.gpus {
            if let Some(w) = state.windows.back_mut()
                && w.end.is_none()
            {
                w.end = Some(at);
            }
            let (holder, charged) = match next.get(&gpu) {
                Some(&(key, charged)) => (Some(key), charged),
                None => (None, false),
            };
            if charged && let Some(account) = holder.and_then(|k| state.accounts.get_mut(&k)) {
                account.accrue(now, slot);
                let charge = i64::try_from(slot.as_nanos()).unwrap_or(i64::MAX);
                account.balance = account.balance.saturating_sub(charge);
                account.advance(charge);
            }
            state.windows.push_back(Window {
                start: at,
                end: None,
                holder,
                charged,
                estimate: if charged { slot } else { Duration::ZERO },
                measured: Duration::ZERO,
                seen_active: false,
            });
        }
        self.holders = next.values().map(|(k, _)| *k).collect();
        self.slot_end = Some(end);
    }

    /// Whether cgroup `key` should be frozen now.
    fn wants_frozen(&self, key: u64, now: Instant) -> bool {
        let mut member = false;
        let mut active = false;
        for gpu in self.gpus.values() {
            if let Some(account) = gpu.accounts.get(&key) {
                member = true;
                active |= account.active;
            }
        }
        if !member || !active {
            // Not regulated, or idle on every GPU: idle costs the others nothing thawed.
            return false;
        }
        if !self.holders.contains(&key) {
            return true;
        }
        // A holder whose next slot is another's stops at the guard.
        match (&self.next, self.slot_end) {
            (Some(next), Some(end)) => {
                now + self.config.guard >= end && !next.values().any(|(k, _)| *k == key)
            }
            _ => false,
        }
    }

    fn apply_all(&mut self, now: Instant, sys: &mut dyn Freezer) {
        let keys: Vec<u64> = self.cgroups.keys().copied().collect();
        let mut gone = Vec::new();
        for key in keys {
            let frozen = self.wants_frozen(key, now);
            if let Some(cgroup) = self.cgroups.get_mut(&key) {
                let frozen = frozen || cgroup.held;
                if cgroup.apply(now, frozen, sys).is_err() {
                    gone.push(key);
                }
            }
        }
        for key in gone {
            self.cgroups.remove(&key);
            self.forget(key);
        }
    }

    /// What the throttle knows of each cgroup, at `now`.
    pub(crate) fn stats(&self, now: Instant) -> impl Iterator<Item = (u64, ThrottleStats)> + '_ {
        self.cgroups.iter().map(move |(&key, cgroup)| {
            let accounts: Vec<&Account> = self
                .gpus
                .values()
                .filter_map(|gpu| gpu.accounts.get(&key))
                .collect();
            let stats = ThrottleStats {
                throttled: cgroup.throttled(now),
                frozen: cgroup.frozen == Some(true),
                running_fraction: accounts.iter().map(|a| a.recent).fold(0.0, f64::max),
                gpu_time: accounts.iter().map(|a| a.gpu_time).sum(),
                balance: accounts.iter().map(|a| a.balance).min().map(seconds),
            };
            (key, stats)
        })
    }

    /// Busy time of each GPU that fell in no one's slot.
    pub(crate) fn unattributed(&self) -> impl Iterator<Item = (u32, Duration)> + '_ {
        self.gpus
            .iter()
            .map(|(&gpu, state)| (gpu, state.unattributed))
    }
}

/// `ns` nanoseconds as signed seconds.
fn seconds(ns: i64) -> f64 {
    let magnitude = Duration::from_nanos(ns.unsigned_abs()).as_secs_f64();
    if ns < 0 { -magnitude } else { magnitude }
}

#[cfg(test)]
mod tests;
