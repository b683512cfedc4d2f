//! `gpuwarden-agent`: the node daemon and its local clients (see [`gpuwarden_agent::cli`]).

fn main() -> std::process::ExitCode {
    gpuwarden_agent::cli::main()
}
