use super::*;

#[test]
fn bad_config_and_members_are_refused() {
    let bad = ThrottleConfig {
        period: Duration::from_millis(10),
        tick: Duration::from_millis(20),
        slots: SlotConfig::default(),
    };
    assert!(matches!(
        spawn(bad, Signal::PerCgroup(Box::new(CpuTimeUsage)), "test"),
        Err(ThrottleError::InvalidConfig { .. })
    ));
    let throttle = spawn(
        ThrottleConfig::default(),
        Signal::PerCgroup(Box::new(CpuTimeUsage)),
        "test",
    )
    .unwrap();
    let member = |dir: &str, share_ppm| Member {
        cgroup_dir: dir.into(),
        share_ppm,
        policy: ComputePolicy::Hard,
    };
    assert!(matches!(
        throttle.set(0, 1, member("/x", 0)),
        Err(ThrottleError::InvalidShare { .. })
    ));
    assert!(matches!(
        throttle.set(0, 1, member("/x", 1_000_001)),
        Err(ThrottleError::InvalidShare { .. })
    ));
    assert!(matches!(
        throttle.set(0, 1, member("x", 10)),
        Err(ThrottleError::RelativeDir { .. })
    ));
}

#[tokio::test]
async fn a_vanished_directory_does_not_stop_the_loop() {
    let throttle = spawn(
        ThrottleConfig::default(),
        Signal::PerCgroup(Box::new(CpuTimeUsage)),
        "test",
    )
    .unwrap();
    throttle
        .set(
            0,
            7,
            Member {
                cgroup_dir: "/nonexistent/gpuwarden-throttle".into(),
                share_ppm: 500_000,
                policy: ComputePolicy::Hard,
            },
        )
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(throttle.stats(7), None);
    throttle.remove(7).unwrap();
    throttle.shutdown().await;
}

#[test]
fn thaw_of_a_missing_cgroup_is_fine() {
    thaw(Path::new("/nonexistent/gpuwarden-throttle")).unwrap();
}
