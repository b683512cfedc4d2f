//! The `gpuwarden` command line, built inside the tests crate so end-to-end tests can run it
//! against an embedded agent: `gpuwarden` exactly, under another name.

fn main() -> std::process::ExitCode {
    gpuwarden_cli::main()
}
