//! `gpu-client --dir DIR [--gpu N]`: a synthetic GPU process driven line by line on stdin (see
//! `gpuwarden_tests::gpu_client` for the command language).

use std::{
    io::{BufRead, BufReader, Write},
    os::fd::{FromRawFd, OwnedFd},
    path::PathBuf,
    process::ExitCode,
};

use gpuwarden_tests::gpu_client::{Command, GpuClient, execute, parse};

/// A forked child and the pipes that drive it.
struct Child {
    pid: libc::pid_t,
    to: std::fs::File,
    from: BufReader<std::fs::File>,
}

fn pipe() -> std::io::Result<(std::fs::File, std::fs::File)> {
    let mut fds = [0; 2];
    // SAFETY: a valid array of two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh fds we own.
    Ok(unsafe {
        (
            std::fs::File::from(OwnedFd::from_raw_fd(fds[0])),
            std::fs::File::from(OwnedFd::from_raw_fd(fds[1])),
        )
    })
}

/// Serves commands from `input`, writing replies (after `prefix`) to `output`, until EOF or
/// `exit`.
fn serve(
    client: &mut GpuClient,
    input: &mut dyn BufRead,
    output: &mut dyn Write,
    prefix: &str,
    child: &mut Option<Child>,
) {
    let mut line = String::new();
    loop {
        line.clear();
        if input.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let reply = match parse(&line) {
            Err(e) => format!("err {e}"),
            Ok(Command::Exit) => return,
            Ok(command) => run(client, &command, child),
        };
        let line = format!("{prefix}{reply}\n");
        if output
            .write_all(line.as_bytes())
            .and_then(|()| output.flush())
            .is_err()
        {
            return;
        }
    }
}

fn run(client: &mut GpuClient, command: &Command, child: &mut Option<Child>) -> String {
    if let Some(reply) = execute(client, command) {
        return reply;
    }
    match command {
        Command::Thread(inner) => std::thread::scope(|s| {
            s.spawn(|| run(client, inner, &mut None))
                .join()
                .unwrap_or_else(|_| "err thread panicked".to_owned())
        }),
        Command::Fork => match fork(client) {
            Ok(c) => {
                let pid = c.pid;
                *child = Some(c);
                format!("ok pid={pid}")
            }
            Err(e) => format!("err fork: {e}"),
        },
        Command::Child(inner) => match child.as_mut() {
            None => "err no child".to_owned(),
            Some(c) => {
                if c.to.write_all(format!("{inner}\n").as_bytes()).is_err() {
                    return "err child gone".to_owned();
                }
                if inner.trim() == "exit" {
                    let mut status = 0;
                    // SAFETY: waiting for our own child.
                    unsafe { libc::waitpid(c.pid, &raw mut status, 0) };
                    *child = None;
                    return "ok".to_owned();
                }
                let mut reply = String::new();
                match c.from.read_line(&mut reply) {
                    Ok(n) if n > 0 => reply.trim_end().to_owned(),
                    _ => "err child gone".to_owned(),
                }
            }
        },
        _ => "err unsupported".to_owned(),
    }
}

fn fork(client: &mut GpuClient) -> std::io::Result<Child> {
    let (child_in, to_child) = pipe()?;
    let (from_child, child_out) = pipe()?;
    // SAFETY: the process is single-threaded here (threads are joined before replying).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        drop(to_child);
        drop(from_child);
        let mut input = BufReader::new(child_in);
        let mut output = child_out;
        serve(client, &mut input, &mut output, "child: ", &mut None);
        // SAFETY: leave without running the parent's destructors twice.
        unsafe { libc::_exit(0) };
    }
    Ok(Child {
        pid,
        to: to_child,
        from: BufReader::new(from_child),
    })
}

fn main() -> ExitCode {
    let mut dir = None;
    let mut gpu = 0;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dir" => dir = args.next().map(PathBuf::from),
            "--gpu" => gpu = args.next().and_then(|g| g.parse().ok()).unwrap_or(0),
            other => {
                eprintln!(
                    "gpu-client: unknown argument {other:?}; usage: gpu-client --dir DIR [--gpu N]"
                );
                return ExitCode::from(2);
            }
        }
    }
    let Some(dir) = dir else {
        eprintln!("gpu-client: --dir DIR is required");
        return ExitCode::from(2);
    };
    let mut client = match GpuClient::open(&dir, gpu) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "gpu-client: cannot open the GPU files in {}: {e}",
                dir.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let _ = writeln!(out, "ready pid={}", std::process::id());
    let _ = out.flush();
    let stdin = std::io::stdin();
    let mut child = None;
    serve(&mut client, &mut stdin.lock(), &mut out, "", &mut child);
    ExitCode::SUCCESS
}
