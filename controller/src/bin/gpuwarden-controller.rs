//! `gpuwarden-controller run [--listen ADDR] [--state-dir DIR] [--config FILE]` (see
//! [`gpuwarden_controller::server`]).

fn main() -> std::process::ExitCode {
    gpuwarden_controller::server::main()
}
