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

// Hostile input: whatever a local client writes, parsing neither panics nor answers with more
// than a bounded echo of it, and every request a client can make survives the wire unchanged.
// `PROPTEST_CASES=100000 cargo test -p gpuwarden-agent-api hostile` runs a longer search.
proptest::proptest! {
    #[test]
    fn hostile_lines_get_a_bounded_error_and_never_a_panic(line in ".{0,4096}") {
        if let Err(Response::Error(msg)) = parse_request(&line) {
            proptest::prop_assert!(msg.len() < 2048, "{} bytes", msg.len());
        }
    }

    #[test]
    fn hostile_json_shapes_are_refused_not_misread(
        key in "[a-z_]{0,20}",
        value in proptest::prelude::any::<i64>(),
    ) {
        let line = format!(r#"{{"request":"kill","{key}":{value}}}"#);
        match parse_request(&line) {
            Ok(Request::Kill { pid }) => {
                // Only a real pid field, in range, is read as one.
                proptest::prop_assert_eq!(key.as_str(), "pid");
                proptest::prop_assert_eq!(i64::from(pid), value);
            }
            Ok(other) => proptest::prop_assert!(false, "{line} read as {other:?}"),
            Err(_) => {}
        }
    }

    #[test]
    fn every_request_round_trips(
        pid in proptest::prelude::any::<u32>(),
        session_id in ".{0,64}",
        which in 0u8..5,
    ) {
        let request = match which {
            0 => Request::Snapshot,
            1 => Request::Node,
            2 => Request::SessionCgroup { session_id },
            3 => Request::Resume { pid },
            _ => Request::Kill { pid },
        };
        let line = serde_json::to_string(&request).expect("encodes");
        proptest::prop_assert_eq!(parse_request(&line), Ok(request));
    }
}

#[test]
fn a_long_malformed_line_is_quoted_only_in_part() {
    let line = "x".repeat(1 << 20);
    let Err(Response::Error(msg)) = parse_request(&line) else {
        panic!("a megabyte of x parsed");
    };
    assert!(msg.len() < 400, "{} bytes", msg.len());
    assert!(msg.contains("xxx\"…"), "{msg}");
}
