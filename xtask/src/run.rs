//! `cargo xtask run`: the main job on this node — the controller and an agent registered with
//! it, on NVIDIA GPUs when there are any, else on the bundled mock GPUs (and it says which).
//! Plain text on loopback by default; `--tls` mints a throw-away CA and runs both over mutual
//! TLS.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::{target_dir, workspace};

/// The controller's address for the local run.
const LISTEN: &str = "127.0.0.1:50051";

/// The node name the agent will use: `--node-name` in its arguments, else `NODE_NAME`, else
/// the host name (as the agent decides).
fn node_name(args: &[String]) -> String {
    let flag = args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--node-name=")
            .map(str::to_owned)
            .or_else(|| {
                (a == "--node-name")
                    .then(|| args.get(i + 1).cloned())
                    .flatten()
            })
    });
    flag.or_else(|| std::env::var("NODE_NAME").ok())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Mints a fresh CA, the controller's certificate, `node`'s and an admin's for the CLI into
/// `dir` (emptied first).
fn mint_throwaway(bin: &Path, dir: &Path, node: &str) -> anyhow::Result<PathBuf> {
    let _ = std::fs::remove_dir_all(dir);
    let status = Command::new(bin.join("gpuwarden-controller"))
        .args([
            "certs",
            "mint",
            "--server-names",
            "localhost,127.0.0.1",
            "--nodes",
            node,
            "--admins",
            "admin",
        ])
        .arg("--out")
        .arg(dir)
        .status()
        .context("minting certificates")?;
    if !status.success() {
        bail!("gpuwarden-controller certs mint failed ({status})");
    }
    Ok(dir.to_owned())
}

/// Builds both binaries and runs them until Ctrl-C; `args` go to `gpuwarden-agent run`.
pub fn run(tls: bool, args: &[String]) -> anyhow::Result<()> {
    if !crate::is_root() {
        bail!("the agent loads eBPF programs: run as root");
    }
    crate::setup::run()?;
    let bin = crate::build_release_binaries()?;
    let state = target_dir().join("gpuwarden-state");
    let scheme = if tls { "https" } else { "http" };
    let url = format!("{scheme}://{LISTEN}");
    let mut controller_command = Command::new(bin.join("gpuwarden-controller"));
    controller_command
        .args(["run", "--listen", LISTEN, "--state-dir"])
        .arg(state.join("controller"));
    let mut agent_args: Vec<String> = vec!["run".into(), "--controller".into(), url.clone()];
    // What the CLI needs besides its default URL.
    let mut cli_flags = String::new();
    if tls {
        let node = node_name(args);
        let certs = mint_throwaway(&bin, &state.join("tls"), &node)?;
        let file = |name: &str| certs.join(name).display().to_string();
        controller_command
            .args(["--tls-cert", &file("server.pem")])
            .args(["--tls-key", &file("server.key")])
            .args(["--tls-client-ca", &file("ca.pem")]);
        // The certificate names this node, so the agent must use the same name.
        if !args
            .iter()
            .any(|a| a == "--node-name" || a.starts_with("--node-name="))
        {
            agent_args.extend(["--node-name".into(), node.clone()]);
        }
        agent_args.extend([
            "--controller-ca".into(),
            file("ca.pem"),
            "--tls-cert".into(),
            file(&format!("{node}.pem")),
            "--tls-key".into(),
            file(&format!("{node}.key")),
        ]);
        // Over TLS the controller wants to know who calls: the CLI shows an admin's certificate.
        cli_flags = format!(
            " --controller {url} --ca {} --cert {} --key {}",
            file("ca.pem"),
            file("admin-admin.pem"),
            file("admin-admin.key")
        );
        println!(
            "run: mutual TLS with a throw-away CA in {} (node certificate for {node})",
            certs.display()
        );
    }
    let mut controller = controller_command
        .spawn()
        .context("starting gpuwarden-controller")?;
    std::thread::sleep(Duration::from_millis(500));

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
        "run: controller on {url}, agent socket /run/gpuwarden/agent.sock. Try:\n  \
         {cli}{cli_flags} session create -r cuda.shares=0.5\n  \
         {cli}{cli_flags} node ls\n  \
         {cli}{cli_flags} node show <NODE>\n  \
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

#[cfg(test)]
mod tests {
    use super::node_name;

    #[test]
    fn the_node_name_comes_from_the_agent_flag_first() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            node_name(&args(&["--no-pin", "--node-name", "gpu-7"])),
            "gpu-7"
        );
        assert_eq!(node_name(&args(&["--node-name=gpu-8"])), "gpu-8");
        assert!(!node_name(&args(&["--no-pin"])).is_empty());
    }
}
