use super::*;
use crate::scheduler::{NewSession, SchedulerConfig, quotas::Standing};

fn slots(tokens: &[&str]) -> ResourceSlot {
    ResourceSlot::parse_any(tokens).expect("test slots parse")
}

fn spec(name: &str, guaranteed: &[&str], limit: Option<&[&str]>, members: &[&str]) -> QueueSpec {
    QueueSpec {
        name: name.to_owned(),
        quota: QueueQuota {
            guaranteed: slots(guaranteed),
            limit: limit.map(slots),
        },
        members: members.iter().map(|m| (*m).to_owned()).collect(),
    }
}

#[test]
fn a_queue_is_set_replaced_and_removed_with_its_members() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    let view = s
        .set_queue(spec(
            "team-a",
            &["cuda.shares=4.5", "cuda.mem=200g"],
            Some(&["cuda.shares=6"]),
            &["bob", "alice"],
        ))
        .unwrap();
    assert_eq!(view.members, ["alice", "bob"]);
    assert_eq!(
        view.quota.guaranteed.to_string(),
        "cuda.mem=200g,cuda.shares=4.5"
    );
    assert!(s.take_changes().quotas);
    // Replaced: bob is no longer a member, and may join another queue.
    s.set_queue(spec("team-a", &["cuda.shares=1"], None, &["alice"]))
        .unwrap();
    s.set_queue(spec("team-b", &[], None, &["bob"])).unwrap();
    assert_eq!(s.config().quotas.queue_of("bob"), Some("team-b"));
    assert_eq!(s.queue_view("team-a").unwrap().quota.limit, None);
    let gone = s.delete_queue("team-a").unwrap();
    assert_eq!(gone.members, ["alice"]);
    assert_eq!(s.config().quotas.queue_of("alice"), None);
    assert_eq!(
        s.delete_queue("team-a"),
        Err(QueueError::NotFound("team-a".into()))
    );
}

#[test]
fn bad_queues_are_refused_naming_what_and_where() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.set_queue(spec("team-a", &[], None, &["alice"])).unwrap();
    let refused = |s: &mut Scheduler, q: QueueSpec| s.set_queue(q).unwrap_err().to_string();
    let e = refused(&mut s, spec("", &[], None, &[]));
    assert!(e.contains("name \"\""), "{e}");
    let e = refused(&mut s, spec("Team_A", &[], None, &[]));
    assert!(e.contains("DNS label"), "{e}");
    let e = refused(
        &mut s,
        spec(
            "team-b",
            &["cuda.shares=4.5"],
            Some(&["cuda.shares=4.4"]),
            &[],
        ),
    );
    assert_eq!(e, "guaranteed[cuda.shares]: 4.5 is above the limit of 4.4");
    let e = refused(&mut s, spec("team-b", &["cuda.shrs=1"], None, &[]));
    assert!(
        e.starts_with("guaranteed: unknown slot \"cuda.shrs\""),
        "{e}"
    );
    let e = refused(&mut s, spec("team-b", &[], Some(&["gpus=1"]), &[]));
    assert!(e.starts_with("limit: unknown slot \"gpus\""), "{e}");
    let e = refused(&mut s, spec("team-b", &[], None, &["alice"]));
    assert!(
        e.contains("\"alice\" is already a member of queue \"team-a\""),
        "{e}"
    );
    let e = refused(&mut s, spec("team-b", &[], None, &["bob", "bob"]));
    assert!(e.contains("\"bob\" is listed twice"), "{e}");
    let e = refused(&mut s, spec("team-b", &[], None, &["-x"]));
    assert!(e.starts_with("members: \"-x\""), "{e}");
    // Nothing of a refused change landed.
    assert!(s.queue_view("team-b").is_none());
    assert!(!s.take_changes().quotas || s.config().quotas.queues.len() == 1);
}

#[test]
fn a_queue_shows_what_it_holds_and_borrows_exactly() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(crate::scheduler::tests::report("n1", 8, &[]), &[])
        .unwrap();
    s.set_queue(spec(
        "team-a",
        &["cuda.shares=0.3"],
        Some(&["cuda.shares=4.5"]),
        &["alice"],
    ))
    .unwrap();
    for (id, shares) in [("a", "0.1"), ("b", "0.2"), ("c", "0.25")] {
        s.create(NewSession {
            id: id.into(),
            owner: "alice".into(),
            requested: slots(&[&format!("cuda.shares={shares}"), "cpu=1"]),
            ..NewSession::default()
        })
        .unwrap();
    }
    s.pass();
    let view = s.queue_view("team-a").unwrap();
    // cpu is not governed; 0.1 + 0.2 + 0.25 is 0.55 exactly, 0.25 past the guarantee.
    assert_eq!(view.held.to_string(), "cuda.shares=0.55");
    assert_eq!(view.borrowed.to_string(), "cuda.shares=0.25");
    assert_eq!(
        s.config()
            .quotas
            .standing(Some("team-a"), &view.held, &slots(&["cuda.shares=4"])),
        Standing::OverLimit {
            slot: crate::slots::SlotName::new("cuda.shares").unwrap()
        }
    );
}
