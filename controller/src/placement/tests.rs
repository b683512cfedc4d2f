use super::*;

#[test]
fn total_rewards_packing_and_charges_the_rest() {
    let w = Weights {
        interference: 2.0,
        fragmentation: 1.0,
        packing: 0.5,
        topology: 3.0,
    };
    let t = Terms {
        interference: 0.25,
        fragmentation: -0.5,
        packing: 0.8,
        topology: 1.0,
    };
    // 0.5 − 0.5 − 0.4 + 3.0
    assert!((t.total(&w) - 2.6).abs() < 1e-12);
    let sum: f64 = t.rows(&w).iter().map(|r| r.3).sum();
    assert!((sum - t.total(&w)).abs() < 1e-12);
}

#[test]
fn bad_settings_are_refused_with_their_name() {
    let mut c = ScoringConfig::default();
    assert!(c.validate().is_ok());
    c.weights.packing = -1.0;
    assert!(c.validate().unwrap_err().to_string().contains("packing"));
    c = ScoringConfig {
        packing_cap: 0.0,
        ..ScoringConfig::default()
    };
    assert!(matches!(c.validate(), Err(ScoringError::Cap(_))));
}
