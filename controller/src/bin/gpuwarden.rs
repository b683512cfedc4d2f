//! `gpuwarden`: the command line for sessions, nodes and slot types (see [`gpuwarden_controller::cli`]).

fn main() -> std::process::ExitCode {
    gpuwarden_controller::cli::main()
}
