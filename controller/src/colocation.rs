//! The co-location model: how much tenants sharing a device will slow each other down,
//! predicted from their profiles alone.
//!
//! Each tenant's utilization is a random variable taking its profile's ten decile points with
//! equal probability, independent of the others. A device delivers at most 1.0: when the
//! tenants together want `S > 1`, each gets `1/S` of what it asked for, so its work takes `S`
//! times as long. Hence, per device:
//! - **overflow** `E[max(0, S − 1)]`: demand the device can't serve;
//! - **slowdown** of tenant `i`: `E[uᵢ · max(1, S)] / E[uᵢ]`, the stretch of its work averaged
//!   over the moments it is busy (an idle tenant suffers nothing);
//! - **summed utilization** `E[S]`, which the packing cap compares against.
//!
//! The distribution of `S` is computed exactly on a 0.01 grid by convolution: ten points per
//! tenant, so a device with `n` tenants costs about `n² · 10 · 100n` operations, nothing next to
//! a network round trip.

use crate::profile::POINTS;

/// Grid steps per unit of utilization.
const GRID: usize = 100;

/// A distribution of summed utilization on the 0.01 grid: `p[k]` is P(S = k / 100).
#[derive(Debug, Clone, PartialEq)]
struct Distribution(Vec<f64>);

impl Distribution {
    /// S = 0 for certain.
    fn zero() -> Self {
        Self(vec![1.0])
    }

    /// Adds an independent tenant with the ten equally likely values `points`.
    fn add(&self, points: &[f64; POINTS]) -> Self {
        let steps: Vec<usize> = points.iter().map(|&u| to_grid(u)).collect();
        let widest = steps.iter().copied().max().unwrap_or(0);
        let mut out = vec![0.0; self.0.len() + widest];
        let w = 1.0 / POINTS as f64;
        for (k, &p) in self.0.iter().enumerate() {
            if p == 0.0 {
                continue;
            }
            for &s in &steps {
                out[k + s] += p * w;
            }
        }
        Self(out)
    }

    /// `E[f(S)]`.
    fn expect(&self, f: impl Fn(f64) -> f64) -> f64 {
        self.0
            .iter()
            .enumerate()
            .map(|(k, &p)| p * f(k as f64 / GRID as f64))
            .sum()
    }
}

fn to_grid(u: f64) -> usize {
    let u = if u.is_nan() { 0.0 } else { u.clamp(0.0, 1.0) };
    (u * GRID as f64).round() as usize
}

fn from_grid(k: usize) -> f64 {
    k as f64 / GRID as f64
}

/// What the model predicts for one device's tenants.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// `E[S]`: the expected summed utilization.
    pub summed: f64,
    /// `E[max(0, S − 1)]`: expected demand above what the device delivers.
    pub overflow: f64,
    /// Each tenant's expected slowdown (≥ 1), in the order given.
    pub slowdowns: Vec<f64>,
}

impl Prediction {
    /// Slowdown beyond running alone, summed over the tenants: `Σ (slowdownᵢ − 1)`.
    #[must_use]
    pub fn total_excess(&self) -> f64 {
        self.slowdowns.iter().map(|s| s - 1.0).sum()
    }
}

/// Predicts contention among tenants with the utilization distributions `tenants`.
#[must_use]
pub fn predict(tenants: &[&[f64; POINTS]]) -> Prediction {
    let all = tenants
        .iter()
        .fold(Distribution::zero(), |acc, t| acc.add(t));
    let summed = all.expect(|s| s);
    let overflow = all.expect(|s| (s - 1.0).max(0.0));
    let slowdowns = (0..tenants.len())
        .map(|i| {
            let others = tenants
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .fold(Distribution::zero(), |acc, (_, t)| acc.add(t));
            slowdown(tenants[i], &others)
        })
        .collect();
    Prediction {
        summed,
        overflow,
        slowdowns,
    }
}

/// `E[u · max(1, u + O)] / E[u]` for a tenant `u` beside the others' sum `O`.
fn slowdown(points: &[f64; POINTS], others: &Distribution) -> f64 {
    let mean: f64 = points.iter().map(|&u| from_grid(to_grid(u))).sum::<f64>() / POINTS as f64;
    if mean <= 0.0 {
        return 1.0;
    }
    let weighted: f64 = points
        .iter()
        .map(|&u| {
            let u = from_grid(to_grid(u));
            u * others.expect(|o| (u + o).max(1.0)) / POINTS as f64
        })
        .sum();
    weighted / mean
}

#[cfg(test)]
mod tests {
    use super::*;

    fn constant(u: f64) -> [f64; POINTS] {
        [u; POINTS]
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn alone_under_one_device_nothing_overflows() {
        let p = predict(&[&constant(0.8)]);
        assert!(close(p.summed, 0.8));
        assert!(close(p.overflow, 0.0));
        assert!(close(p.slowdowns[0], 1.0));
    }

    #[test]
    fn two_steady_tenants_overflow_by_their_excess() {
        // 0.7 + 0.6 = 1.3 always: overflow 0.3, both stretched by 1.3.
        let p = predict(&[&constant(0.7), &constant(0.6)]);
        assert!(close(p.summed, 1.3), "{p:?}");
        assert!(close(p.overflow, 0.3), "{p:?}");
        assert!(p.slowdowns.iter().all(|&s| close(s, 1.3)), "{p:?}");
        assert!(close(p.total_excess(), 0.6));
    }

    #[test]
    fn bursty_tenants_overflow_only_when_bursts_meet() {
        // Each is busy (1.0) a tenth of the time, idle otherwise: they collide 1% of the time,
        // when S = 2 (overflow 1.0), so E[overflow] = 0.01.
        let mut bursty = [0.0; POINTS];
        bursty[9] = 1.0;
        let p = predict(&[&bursty, &bursty]);
        assert!(close(p.summed, 0.2), "{p:?}");
        assert!(close(p.overflow, 0.01), "{p:?}");
        // When busy, the other is busy a tenth of the time: E[max(1, S) | busy] = 1.1.
        assert!(p.slowdowns.iter().all(|&s| close(s, 1.1)), "{p:?}");
    }

    #[test]
    fn an_idle_tenant_suffers_nothing_and_costs_nothing() {
        let p = predict(&[&constant(0.0), &constant(0.9)]);
        assert!(close(p.slowdowns[0], 1.0));
        assert!(close(p.slowdowns[1], 1.0));
        assert!(close(p.overflow, 0.0));
    }

    #[test]
    fn uneven_distribution_matches_hand_computation() {
        // A: 0.2 or 0.8 (half each); B: 0.5. S = 0.7 or 1.3: overflow = 0.5·0.3 = 0.15.
        let mut a = [0.2; POINTS];
        for d in &mut a[5..] {
            *d = 0.8;
        }
        let p = predict(&[&a, &constant(0.5)]);
        assert!(close(p.summed, 1.0), "{p:?}");
        assert!(close(p.overflow, 0.15), "{p:?}");
        // A: (0.5·0.2·1 + 0.5·0.8·1.3) / 0.5 = (0.1 + 0.52) / 0.5 = 1.24.
        assert!(close(p.slowdowns[0], 1.24), "{p:?}");
        // B: 0.5·(0.5·1 + 0.5·1.3) / 0.5 = 1.15.
        assert!(close(p.slowdowns[1], 1.15), "{p:?}");
    }

    #[test]
    fn no_tenants_predict_an_idle_device() {
        let p = predict(&[]);
        assert!(close(p.summed, 0.0) && close(p.overflow, 0.0) && p.slowdowns.is_empty());
    }
}
