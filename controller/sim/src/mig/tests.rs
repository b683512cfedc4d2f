use super::*;

/// Device indexes of the instances of GPU `gpu` of `node`.
fn on(node: &MigNode, gpu: &str) -> Vec<(String, u32)> {
    node.instances()
        .filter(|(g, _)| g.uuid == gpu)
        .map(|(_, i)| (i.profile.name.to_owned(), i.start))
        .collect()
}

#[test]
fn the_operators_gpus_hold_the_balanced_layout_and_the_others_nothing() {
    let node = MigNode::new("n", 4, 2);
    assert_eq!(
        on(&node, "n-GPU-0"),
        vec![
            ("1g.18gb".to_owned(), 0),
            ("1g.18gb".to_owned(), 1),
            ("2g.35gb".to_owned(), 2),
            ("3g.71gb".to_owned(), 4)
        ]
    );
    assert!(on(&node, "n-GPU-2").is_empty());
    let report = node.report();
    // Eight instances, numbered after the four GPUs; no GPU offered whole.
    let indexes: Vec<u32> = report.devices.iter().map(|d| d.index).collect();
    assert_eq!(indexes, (4..12).collect::<Vec<_>>());
    assert!(
        report
            .device_models
            .iter()
            .all(|(m, mig)| *mig && m.contains(" MIG "))
    );
    assert!(
        report
            .devices
            .iter()
            .all(|d| d.parent_uuid.starts_with("n-GPU-"))
    );
    // Only the handed-over GPUs are reported for change, every start free.
    let uuids: Vec<&str> = report
        .mig_layouts
        .iter()
        .map(|l| l.gpu_uuid.as_str())
        .collect();
    assert_eq!(uuids, ["n-GPU-2", "n-GPU-3"]);
    let one_g = &report.mig_layouts[0]
        .profiles
        .iter()
        .find(|p| p.profile == "1g.18gb")
        .unwrap();
    assert_eq!(one_g.free, one_g.starts);
    // Each profile a slot, with its count: two 1g.18gb per balanced GPU, none made yet.
    assert_eq!(
        report.capacity.get("cuda.mig.1g.18gb"),
        SlotValue::from_int(4)
    );
    assert_eq!(report.capacity.get("cuda.mig.7g.141gb"), SlotValue::ZERO);
}

#[test]
fn what_the_driver_refuses_is_refused_and_nothing_made() {
    let mut node = MigNode::new("n", 2, 1);
    // GPU 0 is the operator's, GPU 1 handed over.
    assert!(matches!(
        node.make("n-GPU-0", "1g.18gb", 6, 0.0),
        Err(MakeError::NotListed { .. })
    ));
    assert!(matches!(
        node.make("n-GPU-9", "1g.18gb", 6, 0.0),
        Err(MakeError::NoGpu { .. })
    ));
    assert!(matches!(
        node.make("n-GPU-1", "5g.99gb", 0, 0.0),
        Err(MakeError::NoProfile { .. })
    ));
    // A 2g.35gb may start at 0, 2 or 4 only; a 1g.18gb never at 7.
    for (profile, start) in [
        ("2g.35gb", 1),
        ("2g.35gb", 6),
        ("1g.18gb", 7),
        ("3g.71gb", 2),
    ] {
        assert!(
            matches!(
                node.make("n-GPU-1", profile, start, 0.0),
                Err(MakeError::Start { .. })
            ),
            "{profile} at {start}"
        );
    }
    let index = node.make("n-GPU-1", "3g.71gb", 4, 0.0).unwrap();
    assert_eq!(
        index,
        2 + 4,
        "after the two GPUs and the operator's four instances"
    );
    // Slices 4-7 are taken now: a 1g.18gb at 5 and a 2g.35gb at 4 overlap.
    for (profile, start) in [("1g.18gb", 5), ("2g.35gb", 4), ("4g.71gb", 0)] {
        let err = node.make("n-GPU-1", profile, start, 0.0);
        if profile == "4g.71gb" {
            assert!(err.is_ok(), "slices 0-3 are free");
        } else {
            assert!(
                matches!(err, Err(MakeError::Overlap { other: 4, .. })),
                "{err:?}"
            );
        }
    }
    assert_eq!(node.changes(), (2, 0));
    let layout = &node.report().mig_layouts[0];
    assert_eq!(layout.occupied, vec![(4, 4), (0, 4)]);
    assert!(
        layout.profiles.iter().all(|p| p.free.is_empty()),
        "{layout:?}"
    );
}

#[test]
fn a_made_instance_goes_once_let_go_or_untaken_past_its_grace() {
    let mut node = MigNode::new("n", 2, 1);
    let taken = node.make("n-GPU-1", "1g.18gb", 6, 0.0).unwrap();
    let untaken = node.make("n-GPU-1", "1g.18gb", 5, 0.0).unwrap();
    let operators: Vec<u32> = node
        .instances()
        .filter(|(_, i)| !i.made_here())
        .map(|(_, i)| i.index)
        .collect();
    // Held, and within the grace: both stay.
    assert!(!node.sweep(&BTreeSet::from([taken]), 10.0));
    assert!(node.instance(taken).is_some() && node.instance(untaken).is_some());
    // Let go: the taken one goes at once; the untaken one waits out its grace.
    assert!(node.sweep(&BTreeSet::new(), 20.0));
    assert!(node.instance(taken).is_none() && node.instance(untaken).is_some());
    assert!(!node.sweep(&BTreeSet::new(), GRACE_SECS - 1.0));
    assert!(node.sweep(&BTreeSet::new(), GRACE_SECS));
    assert!(node.instance(untaken).is_none());
    assert_eq!(node.changes(), (2, 2));
    // The operator's instances are never destroyed, held or not.
    assert!(!node.sweep(&BTreeSet::new(), 1e9));
    assert!(operators.iter().all(|&i| node.instance(i).is_some()));
    // Indexes are not reused.
    assert!(node.make("n-GPU-1", "1g.18gb", 6, 0.0).unwrap() > untaken);
}

#[test]
fn a_cut_node_offers_its_whole_gpus_and_the_operators_instances_only() {
    let node = MigNode::cut("n", 2, 2, 2);
    // GPUs 0 and 1 whole; 2 and 3 in the balanced layout, neither handed over.
    assert!(on(&node, "n-GPU-0").is_empty() && on(&node, "n-GPU-1").is_empty());
    for gpu in ["n-GPU-2", "n-GPU-3"] {
        let layout: Vec<(String, u32)> = BALANCED
            .iter()
            .map(|&(p, start)| (p.to_owned(), start))
            .collect();
        assert_eq!(on(&node, gpu), layout);
    }
    let report = node.report();
    let whole: Vec<u32> = report
        .devices
        .iter()
        .filter(|d| d.parent_uuid.is_empty())
        .map(|d| d.index)
        .collect();
    assert_eq!(whole, [0, 1]);
    assert_eq!(report.devices.len(), 2 + 2 * BALANCED.len());
    assert!(report.mig_layouts.is_empty(), "nothing to make on");
    assert_eq!(
        report.capacity.get("cuda.mig.1g.18gb"),
        SlotValue::from_int(4)
    );
    assert_eq!(
        report.capacity.get("cuda.mig.3g.71gb"),
        SlotValue::from_int(2)
    );
}
