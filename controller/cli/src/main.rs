//! `gpuwarden`: the command line for sessions, nodes, slot types and profiles (see
//! [`gpuwarden_cli`]).

fn main() -> std::process::ExitCode {
    gpuwarden_cli::main()
}
