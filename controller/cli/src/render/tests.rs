//! The human tables, checked line by line.

use super::*;

#[test]
fn a_session_shows_its_entitled_and_achieved_share() {
    let mut s = pb::Session {
        id: "s-1".into(),
        share: Some(pb::SessionShare {
            entitled_compute: 0.5,
            entitled_memory_bytes: 1 << 30,
            ..Default::default()
        }),
        ..Default::default()
    };
    let text = session(&s);
    assert!(
        text.contains("entitled:  compute 0.500 of each GPU, memory 1073741824 bytes"),
        "{text}"
    );
    assert!(text.contains("achieved:  no usage reported yet"), "{text}");
    s.share = Some(pb::SessionShare {
        entitled_compute: 0.5,
        entitled_memory_bytes: 1 << 30,
        samples: 30,
        achieved_mean: 0.4125,
        window_samples: 12,
        achieved_last: 0.375,
        last_memory_bytes: 2048,
        peak_memory_bytes: 4096,
    });
    let text = session(&s);
    assert!(
        text.contains(
            "achieved:  compute 0.412 mean of the last 12 reports, 0.375 at the last; \
             memory 2048 bytes at the last (peak 4096); 30 reports in all"
        ),
        "{text}"
    );
}

#[test]
fn explain_lists_the_decisions_before_the_placement() {
    let decision = |at_ms, kind: &str, detail: &str| pb::SchedulingDecision {
        at_ms,
        kind: kind.into(),
        detail: detail.into(),
        decision_kind: 0,
    };
    let s = pb::Session {
        id: "s-1".into(),
        reason: "waits for preempted sessions to release their resources: s-0".into(),
        decisions: vec![decision(
            1_000,
            "preempted",
            "s-0 on n1 (queue a reclaims its guarantee from queue b)",
        )],
        ..Default::default()
    };
    let text = explanation(&s);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "decisions:", "{text}");
    assert!(
        lines[1].contains("1000")
            && lines[1].contains("preempted")
            && lines[1].contains("s-0 on n1"),
        "{text}"
    );
    assert_eq!(
        lines[2],
        "session s-1 is not placed yet: waits for preempted sessions to release their resources: s-0"
    );
    // Nothing decided yet: only the wait.
    let quiet = pb::Session {
        decisions: Vec::new(),
        ..s
    };
    assert!(explanation(&quiet).starts_with("session s-1 is not placed yet"));
}

#[test]
fn a_session_shows_its_target_policy_and_events() {
    let s = pb::Session {
        id: "s-1".into(),
        target: Some(pb::Target {
            kind: Some(pb::target::Kind::ContainerId("ab12".into())),
        }),
        policy: Some(pb::QuotaPolicy {
            memory: "stop".into(),
            compute: "hard".into(),
            ..Default::default()
        }),
        events: vec![pb::EnforcementEvent {
            action: "stop".into(),
            reason: "over its GPU-memory limit".into(),
            container: "ab12".into(),
            pid: 77,
            device: 1,
            used_bytes: 5,
            limit_bytes: 4,
            requested_bytes: 2,
            at_ms: 123,
            ..Default::default()
        }],
        ..Default::default()
    };
    let text = session(&s);
    assert!(text.contains("target:    container ab12"), "{text}");
    assert!(
        text.contains("policy:    memory=stop compute=hard"),
        "{text}"
    );
    let event = text.lines().last().unwrap_or_default();
    for part in ["123", "stop", "77", "GPU1", "ab12", "used 5 of 4 bytes"] {
        assert!(event.contains(part), "{part}: {text}");
    }
}

#[test]
fn an_event_shows_its_action_enum_and_a_newer_action_by_its_name() {
    let shown = |action: &str, kind: pb::EnforcementAction| {
        let s = pb::Session {
            events: vec![pb::EnforcementEvent {
                action: action.into(),
                action_kind: kind.into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = session(&s);
        text.lines()
            .last()
            .unwrap_or_default()
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned()
    };
    // A sender that fills only the enum, and one that fills only the string.
    assert_eq!(
        shown("", pb::EnforcementAction::SuspendRefused),
        "suspend_refused"
    );
    assert_eq!(
        shown("released", pb::EnforcementAction::Unspecified),
        "released"
    );
    // An action this build does not number: its name as sent.
    assert_eq!(
        shown("throttle", pb::EnforcementAction::Unspecified),
        "throttle"
    );
}

fn node_with_a_session() -> pb::Node {
    let slot = |pairs: &[(&str, &str)]| pb::ResourceSlot {
        values: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    };
    pb::Node {
        info: Some(pb::NodeInfo {
            node_id: "gpu-node-1".into(),
            devices: vec![pb::Device::default(), pb::Device::default()],
            slot_types: vec![pb::SlotType {
                name: "mem".into(),
                kind: pb::SlotKind::Bytes.into(),
            }],
            capacity: Some(slot(&[("cpu", "16"), ("mem", "68719476736")])),
            ..Default::default()
        }),
        state: pb::NodeState::Ready.into(),
        allocated: Some(slot(&[
            ("cuda.shares", "0.8"),
            ("cuda.mem", "4294967296"),
            ("cuda.device", "0"),
        ])),
        capacity: Some(slot(&[
            ("cpu", "16"),
            ("mem", "68719476736"),
            ("cuda.shares", "2"),
            ("cuda.device", "2"),
            ("cuda.mem", "171798691840"),
        ])),
        ..Default::default()
    }
}

#[test]
fn nodes_show_gpu_slots_allocated_of_capacity_in_binary_units() {
    let table = nodes(&[node_with_a_session()]);
    let row = table.lines().nth(1).unwrap_or_default();
    for part in [
        "gpu-node-1",
        "ready",
        " 2 ",
        "0.8/2",
        "4.0 GiB/160.0 GiB",
        "cpu 0/16",
        "mem 0 B/64.0 GiB",
    ] {
        assert!(row.contains(part), "{part}: {table}");
    }
    let detail = node(&node_with_a_session(), &[]);
    assert!(
        detail.contains("cuda.shares 0.8/2") && detail.contains("cuda.mem 4.0 GiB/160.0 GiB"),
        "{detail}"
    );
}

#[test]
fn mig_instances_are_listed_under_their_gpu() {
    let device = |uuid: &str, index: u32, parent: &str, allocated: &str| pb::DeviceAllocation {
        uuid: uuid.into(),
        index,
        capacity_shares: "1".into(),
        allocated_shares: allocated.into(),
        memory_bytes: 20 << 30,
        parent_uuid: parent.into(),
        ..Default::default()
    };
    let devices = [
        device("GPU-a", 0, "", "0.5"),
        device("MIG-x", 8, "GPU-b", "1"),
        device("GPU-c", 2, "", "0"),
        device("MIG-y", 9, "GPU-b", "0"),
    ];
    let detail = node(&node_with_a_session(), &devices);
    let lines: Vec<&str> = detail
        .lines()
        .skip_while(|l| !l.starts_with("GPU0"))
        .collect();
    assert!(
        lines[0].starts_with("GPU0 ") && lines[0].contains("0.50"),
        "{detail}"
    );
    assert!(lines[1].starts_with("GPU2 "), "{detail}");
    assert_eq!(lines[2], "GPU GPU-b in MIG mode:", "{detail}");
    assert!(
        lines[3].starts_with("  MIG8 ") && lines[3].contains("1.00"),
        "{detail}"
    );
    assert!(
        lines[4].starts_with("  MIG9 ") && lines[4].contains("0.00"),
        "{detail}"
    );
    assert_eq!(lines.len(), 5, "{detail}");
}

#[test]
fn a_long_session_name_keeps_the_columns() {
    let session = |name: &str, owner: &str| pb::Session {
        id: "s-0123456789abcdef".into(),
        name: name.into(),
        owner: owner.into(),
        node_id: "n1".into(),
        state: pb::SessionState::Running.into(),
        ..Default::default()
    };
    // Two owners: the OWNER column is shown.
    let table = sessions(&[
        session("short", "alice"),
        session("a-training-job-with-a-very-long-name", "alice"),
        session("other", "bob"),
    ]);
    let lines: Vec<&str> = table.lines().collect();
    // Columns are counted in characters: `…` is one column and three bytes.
    let owner_at = |line: &str| line.find("alice").map(|at| line[..at].chars().count());
    assert_eq!(owner_at(lines[1]), owner_at(lines[2]), "{table}");
    assert_eq!(lines[0].find("OWNER"), owner_at(lines[1]), "{table}");
    assert!(lines[2].contains("a-training-job-with…"), "{table}");
}

/// What `session ls` shows most: sessions with no name, a managed `run`'s slots, a hostname.
/// Each row starts with the whole id, NAME is `-` (the controller names such a session by its
/// id, which the row already starts with), and every line fits 100 columns.
#[test]
fn the_common_session_table_reads_at_a_glance() {
    let session = |id: &str, requested: &[(&str, &str)]| pb::Session {
        id: id.into(),
        // As the controller stores a session created without a name.
        name: id.into(),
        owner: "default".into(),
        node_id: "build-worker-03".into(),
        state: pb::SessionState::Terminated.into(),
        requested: Some(pb::ResourceSlot {
            values: requested
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }),
        ..Default::default()
    };
    let ids = ["s-19ac9f3d1e20001", "s-19ac9f3d1e2000a"];
    let table = sessions(&[
        session(ids[0], &[("cuda.shares", "0.2")]),
        session(
            ids[1],
            &[
                ("cuda.mem", "4294967296"),
                ("cuda.shares", "0.5"),
                ("cpu", "1"),
            ],
        ),
    ]);
    for line in table.lines() {
        assert!(line.chars().count() <= 100, "{} wide: {line}", line.len());
    }
    assert!(
        !table.contains("OWNER"),
        "one owner: no OWNER column\n{table}"
    );
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0][..2], ["ID", "NAME"], "{table}");
    for (row, id) in rows[1..].iter().zip(ids) {
        assert_eq!(row[..3], [id, "-", "terminated"], "{table}");
    }
    assert!(
        !table.contains("ORIGIN"),
        "all placed by the controller: {table}"
    );
    assert!(!table.contains('…'), "nothing cut: {table}");
    // Requests as `-r` takes them back.
    assert!(
        rows[2].last() == Some(&"cpu=1,cuda.mem=4g,cuda.shares=0.5"),
        "{table}"
    );
}

#[test]
fn observed_sessions_show_their_origin_claim_and_pod() {
    let placed = pb::Session {
        id: "s-1".into(),
        owner: "alice".into(),
        origin: "controller".into(),
        ..Default::default()
    };
    let observed = pb::Session {
        id: "k8s-1111".into(),
        name: "train-0".into(),
        owner: "k8s:ml".into(),
        origin: "dra".into(),
        kubernetes: Some(pb::KubernetesClaim {
            namespace: "ml".into(),
            claim_name: "half".into(),
            claim_uid: "1111".into(),
            pod_name: "train-0".into(),
            pod_uid: "2222".into(),
        }),
        ..Default::default()
    };
    let table = sessions(&[placed, observed.clone()]);
    let lines: Vec<&str> = table.lines().collect();
    let origin_at = lines[0].find("ORIGIN").unwrap();
    assert_eq!(lines[1].get(origin_at..origin_at + 10), Some("controller"));
    assert_eq!(lines[2].get(origin_at..origin_at + 4), Some("dra "));
    assert!(lines[2].ends_with("claim ml/half pod train-0"), "{table}");
    assert!(!lines[1].contains("claim"), "{table}");
    let detail = session(&observed);
    assert!(detail.contains("claim:     ml/half (uid 1111)"), "{detail}");
    assert!(
        detail.contains("pod:       ml/train-0 (uid 2222)"),
        "{detail}"
    );
    let gpu = |kubernetes, sessions: &[&str]| pb::DeviceAllocation {
        index: u32::from(kubernetes),
        capacity_shares: "1".into(),
        allocated_shares: "0.5".into(),
        sessions: sessions.iter().map(|s| (*s).to_owned()).collect(),
        kubernetes,
        ..Default::default()
    };
    let shown = node(
        &pb::Node::default(),
        &[gpu(false, &["s-1"]), gpu(true, &["k8s-1111"])],
    );
    assert!(
        shown.contains("GPU0 █████░░░░░ 0.50  0/0 GiB  s-1"),
        "{shown}"
    );
    assert!(
        shown.contains("GPU1 █████░░░░░ 0.50  0/0 GiB  [k8s] k8s-1111"),
        "{shown}"
    );
}

#[test]
fn bars_show_the_fraction() {
    assert_eq!(bar(0.8, 10), "████████░░");
    assert_eq!(bar(0.0, 10), "░░░░░░░░░░");
    assert_eq!(bar(1.5, 4), "████");
}

#[test]
fn a_queue_shows_exact_values_with_units_for_bytes() {
    let wire = |pairs: &[(&str, &str)]| {
        Some(pb::ResourceSlot {
            values: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        })
    };
    let q = pb::Queue {
        name: "team-a".into(),
        guaranteed: wire(&[("cuda.shares", "4.5"), ("cuda.mem", "214748364800")]),
        limit: None,
        members: vec!["alice".into(), "bob".into()],
        held: wire(&[("cuda.shares", "0.3")]),
        borrowed: wire(&[]),
        etag: String::new(),
    };
    let shown = queue(&q);
    assert_eq!(
        shown,
        "name:       team-a\n\
         guaranteed: cuda.mem=200g,cuda.shares=4.5\n\
         limit:      none\n\
         held:       cuda.shares=0.3\n\
         borrowed:   -\n\
         members:    alice, bob\n"
    );
    let table = queues(&[q]);
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(
        row.starts_with("team-a           cuda.mem=200g,cuda.shares=4.5    -   "),
        "{row}"
    );
}
