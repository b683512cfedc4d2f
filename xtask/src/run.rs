//! `cargo xtask run`: the main job on this node — the controller and an agent registered with
//! it, on NVIDIA GPUs when there are any, else on the bundled mock GPUs (and it says which).

use std::{
    path::Path,
    process::{Child, Command},
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::{target_dir, workspace};

/// The controller's address for the local run.
const LISTEN: &str = "127.0.0.1:50051";

/// Builds both binaries and runs them until Ctrl-C; `args` go to `gpuwarden-agent run`.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    if !crate::is_root() {
        bail!("the agent loads eBPF programs: run as root");
    }
    crate::setup::run()?;
    let bin = crate::build_release_binaries()?;
    let state = target_dir().join("gpuwarden-state");
    let mut controller = Command::new(bin.join("gpuwarden-controller"))
        .args(["run", "--listen", LISTEN, "--state-dir"])
        .arg(state.join("controller"))
        .spawn()
        .context("starting gpuwarden-controller")?;
    std::thread::sleep(Duration::from_millis(500));

    let mut agent_args: Vec<String> = vec![
        "run".into(),
        "--controller".into(),
        format!("http://{LISTEN}"),
    ];
    if Path::new("/dev/nvidiactl").exists() {
        println!("run: NVIDIA driver found: the agent uses NVML for GPUs");
    } else {
        let mock = workspace().join("deploy/mock-devices.toml");
        println!(
            "run: no NVIDIA driver on this machine (no /dev/nvidiactl): the agent uses the mock GPUs in {}",
            mock.display()
        );
        agent_args.push("--mock-devices".into());
        agent_args.push(mock.display().to_string());
    }
    agent_args.extend(args.iter().cloned());
    let mut agent = match Command::new(bin.join("gpuwarden-agent"))
        .args(&agent_args)
        .spawn()
    {
        Ok(agent) => agent,
        Err(e) => {
            stop(&mut controller);
            return Err(e).context("starting gpuwarden-agent");
        }
    };
    // Where the binaries really are: `target/release` unless `CARGO_TARGET_DIR` moves it.
    let (cli, agent_cli) = (bin.join("gpuwarden"), bin.join("gpuwarden-agent"));
    let (cli, agent_cli) = (cli.display(), agent_cli.display());
    println!(
        "run: controller on http://{LISTEN}, agent socket /run/gpuwarden/agent.sock. Try:\n  \
         {cli} session create -r cuda.shares=0.5\n  \
         {cli} node ls\n  \
         {cli} node show <NODE>\n  \
         {agent_cli} top\n\
         Ctrl-C stops both."
    );
    // Either exiting (or Ctrl-C, which reaches both children too) ends the run.
    loop {
        if let Some(s) = agent.try_wait()? {
            stop(&mut controller);
            if s.success() {
                return Ok(());
            }
            bail!("gpuwarden-agent exited ({s})");
        }
        if let Some(s) = controller.try_wait()? {
            stop(&mut agent);
            if s.success() {
                return Ok(());
            }
            bail!("gpuwarden-controller exited ({s})");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn stop(child: &mut Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id().cast_signed(), libc::SIGTERM) };
    let _ = child.wait();
}
