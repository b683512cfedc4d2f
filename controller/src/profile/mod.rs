//! Workload profiles: what sessions of a class used, learned from what their agents measured.
//!
//! While a session runs its agent reports [`UsageSample`]s; the scheduler keeps them in the
//! session's [`UsageSeries`], a fixed-size histogram (a long session costs no more than a short
//! one). When the session ends the series is folded into a [`Profile`] for its class: a
//! 10-point utilization distribution (the 5th, 15th, …, 95th percentiles, so each point stands
//! for a tenth of the time) plus peak memory. A class's profile blends its runs, the newest
//! weighing at least [`MIN_NEW_WEIGHT`], so a class whose behaviour changes is relearned in a
//! few runs. Classes never seen get [`Profile::prior`], a conservative guess that learning
//! replaces.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

/// Points in a profile's utilization distribution.
pub const POINTS: usize = 10;

/// Histogram bins over utilization 0..=1 (0.01 wide).
const BINS: usize = 101;

/// A series needs this many samples before it teaches its class anything.
pub const MIN_SAMPLES: u64 = 3;

/// The newest run's weight in its class's profile is at least this (older runs fade).
pub const MIN_NEW_WEIGHT: f64 = 0.2;

/// Reports [`UsageSeries::recent_mean`] averages over: a minute at the agent's default 5 s.
pub const RECENT: usize = 12;

/// One report of what a running session used.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct UsageSample {
    /// Fraction of one device's compute it used, averaged over its devices (clamped to 0..=1).
    pub utilization: f64,
    /// GPU memory it holds, over all its devices.
    pub memory_bytes: u64,
    /// GPU ioctls per second.
    pub ioctls_per_sec: f64,
}

/// The samples of one running session, kept as a histogram.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageSeries {
    /// Samples per 0.01-wide utilization bin.
    bins: Vec<u32>,
    /// Samples taken.
    pub samples: u64,
    /// The most memory seen.
    pub peak_memory_bytes: u64,
    /// Sum of the ioctl rates (for the mean).
    ioctl_rate_sum: f64,
    /// The utilization of the newest [`RECENT`] samples, oldest first (series stored before
    /// it was kept: empty).
    #[serde(default)]
    recent: VecDeque<f64>,
    /// The newest sample, its utilization clamped (`None`: none reported yet).
    #[serde(default)]
    pub last: Option<UsageSample>,
}

impl Default for UsageSeries {
    fn default() -> Self {
        // Allocated at the first sample: most sessions are made, placed and stored many
        // times before one comes.
        Self {
            bins: Vec::new(),
            samples: 0,
            peak_memory_bytes: 0,
            ioctl_rate_sum: 0.0,
            recent: VecDeque::new(),
            last: None,
        }
    }
}

impl UsageSeries {
    /// Whether no sample was recorded (it says nothing, and need not be stored).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.samples == 0 && self.last.is_none() && self.peak_memory_bytes == 0
    }

    /// Adds a sample; utilization outside 0..=1 (or not a number) is clamped.
    pub fn record(&mut self, sample: UsageSample) {
        let u = clamp_unit(sample.utilization);
        // Rounded to the nearest bin: 0.255 → bin 26 is as good as 25 at this resolution.
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a clamped utilization's bin"
        )]
        let bin = ((u * (BINS - 1) as f64).round() as usize).min(BINS - 1);
        if self.bins.len() != BINS {
            self.bins = vec![0; BINS];
        }
        self.bins[bin] = self.bins[bin].saturating_add(1);
        self.samples += 1;
        self.peak_memory_bytes = self.peak_memory_bytes.max(sample.memory_bytes);
        if sample.ioctls_per_sec.is_finite() && sample.ioctls_per_sec >= 0.0 {
            self.ioctl_rate_sum += sample.ioctls_per_sec;
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(u);
        self.last = Some(UsageSample {
            utilization: u,
            ..sample
        });
    }

    /// Mean utilization over the newest samples (at most [`RECENT`]) and how many it covers;
    /// `None` before any.
    #[must_use]
    pub fn recent_mean(&self) -> Option<(f64, usize)> {
        let n = self.recent.len();
        (n > 0).then(|| (self.recent.iter().sum::<f64>() / n as f64, n))
    }

    /// The 5th, 15th, …, 95th percentiles of the samples (all zero without samples).
    #[must_use]
    pub fn deciles(&self) -> [f64; POINTS] {
        let mut out = [0.0; POINTS];
        if self.samples == 0 {
            return out;
        }
        let total = self.samples as f64;
        for (i, point) in out.iter_mut().enumerate() {
            // The sample whose rank is at this point's quantile.
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a rank within the sample count"
            )]
            let rank = ((i as f64 + 0.5) / POINTS as f64 * total).floor() as u64;
            let mut seen = 0u64;
            for (bin, &count) in self.bins.iter().enumerate() {
                seen += u64::from(count);
                if seen > rank {
                    *point = bin as f64 / (BINS - 1) as f64;
                    break;
                }
            }
        }
        out
    }

    /// Mean ioctl rate over the samples.
    #[must_use]
    pub fn mean_ioctls_per_sec(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.ioctl_rate_sum / self.samples as f64
        }
    }
}

/// What sessions of one class used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// The class.
    pub class: String,
    /// Runs folded in (0: the prior).
    pub runs: u32,
    /// Samples folded in.
    pub samples: u64,
    /// Utilization at the 5th, 15th, …, 95th percentiles: ten equally likely points.
    pub deciles: [f64; POINTS],
    /// The most GPU memory any run held.
    pub peak_memory_bytes: u64,
    /// Mean GPU ioctls per second.
    pub mean_ioctls_per_sec: f64,
    /// Last update, ms since the epoch.
    pub updated_at_ms: i64,
}

impl Profile {
    /// The guess for a class never seen: busy (utilization spread evenly over 0.4..=1.0, mean
    /// 0.7), so unknown work is kept apart until its runs show it can share.
    #[must_use]
    pub fn prior(class: &str) -> Self {
        Self {
            class: class.to_owned(),
            runs: 0,
            samples: 0,
            deciles: prior_deciles(),
            peak_memory_bytes: 0,
            mean_ioctls_per_sec: 0.0,
            updated_at_ms: 0,
        }
    }

    /// Mean utilization.
    #[must_use]
    pub fn mean(&self) -> f64 {
        self.deciles.iter().sum::<f64>() / POINTS as f64
    }

    /// Folds one finished run in. Quantiles are averaged point by point (the quantile average
    /// of two distributions keeps their shape, where averaging histograms would blur it); the
    /// run weighs `1 / (runs + 1)`, at least [`MIN_NEW_WEIGHT`]. A prior is replaced outright.
    pub fn fold(&mut self, series: &UsageSeries, now_ms: i64) {
        let new = series.deciles();
        let weight = if self.runs == 0 {
            1.0
        } else {
            (1.0 / f64::from(self.runs + 1)).max(MIN_NEW_WEIGHT)
        };
        for (old, new) in self.deciles.iter_mut().zip(new) {
            *old = *old * (1.0 - weight) + new * weight;
        }
        self.mean_ioctls_per_sec = if self.runs == 0 {
            series.mean_ioctls_per_sec()
        } else {
            self.mean_ioctls_per_sec * (1.0 - weight) + series.mean_ioctls_per_sec() * weight
        };
        self.peak_memory_bytes = self.peak_memory_bytes.max(series.peak_memory_bytes);
        self.runs = self.runs.saturating_add(1);
        self.samples = self.samples.saturating_add(series.samples);
        self.updated_at_ms = now_ms;
    }
}

/// The learned profiles, by class.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProfileBook {
    profiles: BTreeMap<String, Profile>,
}

impl ProfileBook {
    /// A book holding `profiles`.
    #[must_use]
    pub fn new(profiles: impl IntoIterator<Item = Profile>) -> Self {
        Self {
            profiles: profiles.into_iter().map(|p| (p.class.clone(), p)).collect(),
        }
    }

    /// The learned profile of `class`, if any.
    #[must_use]
    pub fn get(&self, class: &str) -> Option<&Profile> {
        self.profiles.get(class)
    }

    /// The utilization points of `class`: its learned profile's, or the prior's. What scoring
    /// reads per tenant, without copying a profile.
    #[must_use]
    pub fn deciles(&self, class: &str) -> [f64; POINTS] {
        self.get(class).map_or_else(prior_deciles, |p| p.deciles)
    }

    /// All learned profiles, by class.
    pub fn iter(&self) -> impl Iterator<Item = &Profile> {
        self.profiles.values()
    }

    /// Folds a finished session's series into its class; the updated profile, or `None` when
    /// the series is too short to teach anything ([`MIN_SAMPLES`]).
    pub fn learn(&mut self, class: &str, series: &UsageSeries, now_ms: i64) -> Option<&Profile> {
        if series.samples < MIN_SAMPLES {
            return None;
        }
        let profile = self
            .profiles
            .entry(class.to_owned())
            .or_insert_with(|| Profile::prior(class));
        profile.fold(series, now_ms);
        Some(profile)
    }
}

/// The prior's points: spread evenly over 0.4..=1.0.
fn prior_deciles() -> [f64; POINTS] {
    std::array::from_fn(|i| 0.4 + 0.6 * (i as f64 + 0.5) / POINTS as f64)
}

fn clamp_unit(x: f64) -> f64 {
    if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) }
}

#[cfg(test)]
mod tests;
