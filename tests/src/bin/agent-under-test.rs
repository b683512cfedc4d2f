//! The agent's command line, built inside the tests crate so end-to-end tests can run (and
//! `kill -9`) it as its own process: `gpuwarden-agent` exactly, under another name.

fn main() -> std::process::ExitCode {
    gpuwarden_agent::cli::main()
}
