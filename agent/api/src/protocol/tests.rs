use super::*;

#[test]
fn requests_round_trip_and_bad_lines_are_named() {
    let line = serde_json::to_string(&Request::Snapshot).unwrap();
    assert_eq!(line, r#"{"request":"snapshot"}"#);
    assert_eq!(parse_request(&line), Ok(Request::Snapshot));
    let Err(Response::Error(msg)) = parse_request(r#"{"request":"reboot"}"#) else {
        panic!("accepted an unknown request");
    };
    assert!(msg.contains("reboot"), "{msg}");
    let line = r#"{"request":"session_cgroup","session_id":"s-1"}"#;
    assert_eq!(
        parse_request(line),
        Ok(Request::SessionCgroup {
            session_id: "s-1".into()
        })
    );
    let answer = Response::SessionCgroup(SessionCgroup {
        session_id: "s-1".into(),
        cgroup_dir: "/sys/fs/cgroup/gpuwarden/s-1".into(),
        bound: true,
    });
    assert_eq!(
        serde_json::to_string(&answer).unwrap(),
        r#"{"session_cgroup":{"session_id":"s-1","cgroup_dir":"/sys/fs/cgroup/gpuwarden/s-1","bound":true}}"#
    );
    assert_eq!(
        serde_json::to_string(&Response::Node(NodeName { name: "n".into() })).unwrap(),
        r#"{"node":{"name":"n"}}"#
    );
}

/// The lines `gpuwarden run` sends and reads, as its own copy of the protocol spelled them.
#[test]
fn the_wire_forms_are_the_agreed_ones() {
    assert_eq!(
        serde_json::to_string(&Request::Node).unwrap(),
        r#"{"request":"node"}"#
    );
    assert_eq!(
        serde_json::to_string(&Request::SessionCgroup {
            session_id: "s-1".into()
        })
        .unwrap(),
        r#"{"request":"session_cgroup","session_id":"s-1"}"#
    );
    let node: Response = serde_json::from_str(r#"{"node":{"name":"n1"}}"#).unwrap();
    assert_eq!(node, Response::Node(NodeName { name: "n1".into() }));
    let cg: Response = serde_json::from_str(
        r#"{"session_cgroup":{"session_id":"s-1","cgroup_dir":"/sys/fs/cgroup/x","bound":false}}"#,
    )
    .unwrap();
    assert_eq!(
        cg,
        Response::SessionCgroup(SessionCgroup {
            session_id: "s-1".into(),
            cgroup_dir: "/sys/fs/cgroup/x".into(),
            bound: false,
        })
    );
    let err: Response = serde_json::from_str(r#"{"error":"no such session"}"#).unwrap();
    assert_eq!(err, Response::Error("no such session".into()));
    assert_eq!(
        serde_json::to_string(&Request::Kill { pid: 7 }).unwrap(),
        r#"{"request":"kill","pid":7}"#
    );
    assert_eq!(
        serde_json::to_string(&Response::Signalled(Signalled {
            pid: 7,
            session_id: "s".into()
        }))
        .unwrap(),
        r#"{"signalled":{"pid":7,"session_id":"s"}}"#
    );
}
