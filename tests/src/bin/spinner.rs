//! The body of the throttle tests' spinner processes (`tests/tests/throttle.rs`): spins in the
//! cgroup it was started in, counting its iterations and the time it saw itself run
//! (`gpuwarden_test_support::spinner`). Started any other way, it says so and exits.

fn main() -> std::process::ExitCode {
    gpuwarden_test_support::spinner::spin_if_asked();
    eprintln!(
        "spinner: started by the throttle tests only, with {} set",
        gpuwarden_test_support::spinner::SPINNER_ENV
    );
    std::process::ExitCode::from(2)
}
