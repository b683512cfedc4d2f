#![expect(
    clippy::float_cmp,
    reason = "deciles of exact test samples compare exactly"
)]

use super::*;

#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "test utilizations in [0, 1]"
)]
fn series(values: &[f64]) -> UsageSeries {
    let mut s = UsageSeries::default();
    for &u in values {
        s.record(UsageSample {
            utilization: u,
            memory_bytes: (u * 1000.0) as u64,
            ioctls_per_sec: 10.0,
        });
    }
    s
}

#[test]
fn deciles_of_a_uniform_series_are_its_band_midpoints() {
    // 0.00, 0.01, …, 0.99: the 5th percentile is 0.05, the 95th 0.95.
    let values: Vec<f64> = (0..100).map(|i| f64::from(i) / 100.0).collect();
    let d = series(&values).deciles();
    for (i, v) in d.iter().enumerate() {
        let expected = (i as f64 * 10.0 + 5.0) / 100.0;
        assert!((v - expected).abs() < 1e-9, "decile {i}: {v} vs {expected}");
    }
}

#[test]
fn a_bimodal_series_keeps_both_modes() {
    // Busy 30% of the time at 0.9, idle otherwise at 0.1.
    let mut values = vec![0.1; 70];
    values.extend([0.9; 30]);
    let d = series(&values).deciles();
    assert_eq!(d[..7], [0.1; 7]);
    assert_eq!(d[7..], [0.9; 3]);
}

#[test]
fn samples_out_of_range_are_clamped_not_lost() {
    let s = series(&[-0.5, f64::NAN, 1.7]);
    assert_eq!(s.samples, 3);
    let d = s.deciles();
    assert_eq!(d[0], 0.0);
    assert_eq!(d[9], 1.0);
}

#[test]
fn learning_replaces_the_prior_then_blends_runs() {
    let mut book = ProfileBook::default();
    assert!(book.get("train").is_none());
    let prior = book.deciles("train");
    assert_eq!(prior, Profile::prior("train").deciles);
    assert!((prior.iter().sum::<f64>() / POINTS as f64 - 0.7).abs() < 1e-9);

    // A first run replaces the prior outright.
    let p = book
        .learn("train", &series(&[0.2; 20]), 5)
        .cloned()
        .unwrap();
    assert_eq!(p.runs, 1);
    assert_eq!(p.deciles, [0.2; POINTS]);
    assert_eq!(p.updated_at_ms, 5);

    // A second run weighs half.
    let p = book
        .learn("train", &series(&[0.6; 20]), 6)
        .cloned()
        .unwrap();
    assert_eq!(p.runs, 2);
    assert!(p.deciles.iter().all(|d| (d - 0.4).abs() < 1e-9), "{p:?}");
    assert_eq!(p.samples, 40);
    assert_eq!(p.peak_memory_bytes, 600);
}

#[test]
fn old_runs_fade_so_a_changed_class_is_relearned() {
    let mut book = ProfileBook::default();
    for _ in 0..50 {
        book.learn("c", &series(&[0.1; 10]), 0);
    }
    // The class turns busy: the newest run weighs at least MIN_NEW_WEIGHT each time.
    for _ in 0..10 {
        book.learn("c", &series(&[0.9; 10]), 0);
    }
    let mean = book.get("c").map(Profile::mean).unwrap_or_default();
    // 0.9 − 0.8·(1 − 0.2)^10 ≈ 0.814.
    assert!(mean > 0.8, "mean {mean}");
}

#[test]
fn too_short_a_run_teaches_nothing() {
    let mut book = ProfileBook::default();
    assert!(book.learn("c", &series(&[0.5; 2]), 0).is_none());
    assert!(book.get("c").is_none());
}

#[test]
fn the_recent_mean_covers_the_newest_samples_and_the_last_is_kept() {
    let empty = UsageSeries::default();
    assert_eq!(empty.recent_mean(), None);
    assert_eq!(empty.last, None);
    // 0.00, 0.05, …, 0.95: the window holds the newest 12 (0.40 through 0.95).
    let values: Vec<f64> = (0..20).map(|i| f64::from(i) / 20.0).collect();
    let s = series(&values);
    let (mean, n) = s.recent_mean().expect("samples");
    assert_eq!(n, RECENT);
    let expected = values[values.len() - RECENT..].iter().sum::<f64>() / RECENT as f64;
    assert!((mean - expected).abs() < 1e-12, "{mean} vs {expected}");
    let last = s.last.expect("a last sample");
    assert_eq!(last.utilization, 0.95);
    assert_eq!(last.memory_bytes, 950);
    // A series stored before the window was kept still reads (empty window, no last).
    let mut old = serde_json::to_value(UsageSeries::default()).expect("serializes");
    let fields = old.as_object_mut().expect("an object");
    fields.remove("recent");
    fields.remove("last");
    let old: UsageSeries = serde_json::from_value(old).expect("reads");
    assert_eq!(old.recent_mean(), None);
}
