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
//! Only the part of a distribution below 1.0 is ever needed: `max(1, S) = S + max(0, 1 − S)`
//! and `max(0, S − 1) = S − 1 + max(0, 1 − S)`, where `E[S]` is the sum of the means. So sums
//! are convolved on a 0.01 grid truncated at 1.0 (utilization is never negative, so mass past
//! 1.0 never comes back): 101 cells × 10 points per tenant added, whatever the tenant count.

use crate::profile::POINTS;

/// Grid steps per unit of utilization.
const GRID: usize = 100;

/// A distribution of summed utilization on the 0.01 grid, cut at 1.0: `p[k]` is
/// P(S = k / 100) for k ≤ 100; the rest of the mass lies above 1.0.
#[derive(Debug, Clone, PartialEq)]
struct Below1(Vec<f64>);

impl Below1 {
    /// S = 0 for certain.
    fn zero() -> Self {
        let mut p = vec![0.0; GRID + 1];
        p[0] = 1.0;
        Self(p)
    }

    /// Adds an independent tenant taking the grid values `steps` with equal probability.
    fn add(&self, steps: &[usize; POINTS]) -> Self {
        let mut out = vec![0.0; GRID + 1];
        let w = 1.0 / POINTS as f64;
        for (k, &p) in self.0.iter().enumerate() {
            if p == 0.0 {
                continue;
            }
            for &s in steps {
                if let Some(cell) = out.get_mut(k + s) {
                    *cell += p * w;
                }
            }
        }
        Self(out)
    }

    /// `E[max(0, room − S)]` for `room` in grid steps (≤ 100).
    fn shortfall(&self, room: usize) -> f64 {
        self.0
            .iter()
            .take(room)
            .enumerate()
            .map(|(k, &p)| p * from_grid(room - k))
            .sum()
    }
}

#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a clamped utilization's grid index"
)]
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
    let steps: Vec<[usize; POINTS]> = tenants.iter().map(|t| t.map(to_grid)).collect();
    let means: Vec<f64> = steps
        .iter()
        .map(|s| s.iter().map(|&k| from_grid(k)).sum::<f64>() / POINTS as f64)
        .collect();
    let summed: f64 = means.iter().sum();
    let all = steps.iter().fold(Below1::zero(), |acc, s| acc.add(s));
    let overflow = (summed - 1.0 + all.shortfall(GRID)).max(0.0);
    let slowdowns = (0..steps.len())
        .map(|i| {
            if means[i] <= 0.0 {
                return 1.0;
            }
            let others = steps
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .fold(Below1::zero(), |acc, (_, s)| acc.add(s));
            let others_mean = summed - means[i];
            // E[u · max(1, u + O)] = E[u · (u + E[O] + E[max(0, 1 − u − O)])].
            let weighted: f64 = steps[i]
                .iter()
                .map(|&k| {
                    let u = from_grid(k);
                    u * (u + others_mean + others.shortfall(GRID - k)) / POINTS as f64
                })
                .sum();
            (weighted / means[i]).max(1.0)
        })
        .collect();
    Prediction {
        summed,
        overflow,
        slowdowns,
    }
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

    /// Every combination of the tenants' points, by brute force.
    fn enumerate(tenants: &[[f64; POINTS]]) -> Prediction {
        let n = tenants.len();
        #[expect(clippy::cast_possible_truncation, reason = "a handful of tenants")]
        let combos = POINTS.pow(n as u32);
        let (mut summed, mut overflow) = (0.0, 0.0);
        let mut weighted = vec![0.0; n];
        let mut means = vec![0.0; n];
        for c in 0..combos {
            #[expect(clippy::cast_possible_truncation, reason = "a handful of tenants")]
            let pick: Vec<f64> = (0..n)
                .map(|i| tenants[i][(c / POINTS.pow(i as u32)) % POINTS])
                .collect();
            let s: f64 = pick.iter().sum();
            let p = 1.0 / combos as f64;
            summed += p * s;
            overflow += p * (s - 1.0).max(0.0);
            for i in 0..n {
                weighted[i] += p * pick[i] * s.max(1.0);
                means[i] += p * pick[i];
            }
        }
        Prediction {
            summed,
            overflow,
            slowdowns: (0..n)
                .map(|i| {
                    if means[i] > 0.0 {
                        weighted[i] / means[i]
                    } else {
                        1.0
                    }
                })
                .collect(),
        }
    }

    proptest::proptest! {
        #[test]
        fn truncated_convolution_matches_brute_force(
            raw in proptest::collection::vec(proptest::collection::vec(0u32..=100, POINTS), 1..=3)
        ) {
            let tenants: Vec<[f64; POINTS]> = raw
                .iter()
                .map(|t| std::array::from_fn(|i| f64::from(t[i]) / 100.0))
                .collect();
            let refs: Vec<&[f64; POINTS]> = tenants.iter().collect();
            let got = predict(&refs);
            let want = enumerate(&tenants);
            proptest::prop_assert!((got.summed - want.summed).abs() < 1e-9);
            proptest::prop_assert!((got.overflow - want.overflow).abs() < 1e-9, "{got:?} {want:?}");
            for (g, w) in got.slowdowns.iter().zip(&want.slowdowns) {
                proptest::prop_assert!((g - w).abs() < 1e-9, "{got:?} {want:?}");
            }
        }
    }

    #[test]
    fn no_tenants_predict_an_idle_device() {
        let p = predict(&[]);
        assert!(close(p.summed, 0.0) && close(p.overflow, 0.0) && p.slowdowns.is_empty());
    }
}
