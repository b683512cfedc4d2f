//! `gpuwarden-sim --help` introduces the simulator, not another binary.

#[test]
fn help_says_what_the_simulator_is() {
    let (first, help) = gpuwarden_test_support::help(env!("CARGO_BIN_EXE_gpuwarden-sim"));
    assert!(first.contains("replays a GPU job trace"), "{help}");
    assert!(!help.contains("controller and the gpuwarden CLI"), "{help}");
}
