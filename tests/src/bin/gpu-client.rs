//! `gpu-client --dir DIR [--gpu N]`: a synthetic GPU process driven line by line on stdin. See
//! `gpuwarden_tests::gpu_client` for the command language.

use std::{
    io::{BufRead, Write},
    path::PathBuf,
    process::ExitCode,
};

use gpuwarden_tests::gpu_client::{GpuClient, script::Session};

const USAGE: &str = "usage: gpu-client --dir DIR [--gpu N]";

fn main() -> ExitCode {
    let mut dir = None;
    let mut gpu = 0;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next()) {
            ("--dir", Some(d)) => dir = Some(PathBuf::from(d)),
            ("--gpu", Some(g)) if g.parse::<u32>().is_ok() => gpu = g.parse().unwrap_or(0),
            (flag, value) => {
                eprintln!("gpu-client: bad argument {flag:?} {value:?}; {USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(dir) = dir else {
        eprintln!("gpu-client: --dir DIR is required; {USAGE}");
        return ExitCode::from(2);
    };
    let client = match GpuClient::open_on(&dir, gpu) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gpu-client: {e}");
            return ExitCode::FAILURE;
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if writeln!(out, "ready pid={}", std::process::id())
        .and_then(|()| out.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    let stdin = std::io::stdin();
    let mut input: &mut dyn BufRead = &mut stdin.lock();
    match Session::new(client).serve(&mut input, &mut out) {
        // `exit`: leave without freeing anything, as a crashing CUDA process would; the kernel
        // closes the fds.
        Ok(_) => std::process::exit(0),
        Err(e) => {
            eprintln!("gpu-client: {e}");
            ExitCode::FAILURE
        }
    }
}
