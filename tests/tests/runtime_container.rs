//! Real container runtimes on this kernel: Debian's `runc`, and `containerd` with its runc shim,
//! run a container whose process is the synthetic GPU client; the agent attributes it to the
//! container id the runtime's cgroup names, refuses it the GPU its quota doesn't hold, and kills
//! it at the allocation that crosses its memory limit.
//!
//! No image is pulled: the root file system is the `gpu-client` binary and the libraries `ldd`
//! lists. The spec is the runtime's own default (`runc spec`) with what a CDI spec for the
//! allocated GPU adds: its device node and the control node (`linux.devices`, 195:N) and device
//! cgroup rules that allow them; the other GPU's node, made on the host, is bind-mounted in and
//! allowed too, so only the agent keeps the container from it. The fake driver's files are
//! bind-mounted at the same path as on the host, where the agent watches them (a real driver's
//! nodes are `/dev/nvidia*` on both sides; the fake driver's are FUSE files, which no device
//! check applies to, so the device nodes and the files that take the ioctls are separate here).
//!
//! crun is not tried: crun 1.8 refuses this kernel's hybrid layout (`cgroups in hybrid mode not
//! supported, drop all controllers from cgroupv2`); see `docs/runtimes.md`.

// Test helpers fail loudly on anything unexpected.
#![expect(
    clippy::unwrap_used,
    reason = "a test's helpers unwrap: a failure there is the test failing"
)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use gpuwarden_agent_api::snapshot::{Container, Snapshot};
use gpuwarden_proto::v1 as pb;
use gpuwarden_test_support::{
    agent,
    devnode::mknod,
    ids::{container_id, pod_uid},
    require_root, scratch,
};
use gpuwarden_tests::harness::{Client, rig::Rig};
use serde_json::{Value, json};
use tempfile::TempDir;

const MIB: u64 = 1 << 20;

/// The NVIDIA character-device major.
const NVIDIA_MAJOR: u32 = 195;

/// runc, driven directly: `runc run` in the foreground with the test's pipes as the container's
/// stdio.
#[test]
#[ignore = "needs root"]
fn runc_runs_a_container_the_agent_attributes_and_enforces() {
    require_root();
    let runc = installed("runc");
    let state = scratch("runc");
    let engine = Engine::Runc {
        runc,
        root: state.path().to_owned(),
    };
    // The kubelet's cgroupfs layout, as containerd's CRI plugin asks runc for it without systemd.
    let pod = pod_uid("runc");
    scenario(&engine, ("cri", &pod), |id| {
        format!("/kubepods/besteffort/pod{pod}/{id}")
    });
}

/// containerd 1.6 with its `io.containerd.runc.v2` shim: `ctr run` with the spec file, the way
/// its CRI plugin names a pod container's cgroup under the systemd layout.
#[test]
#[ignore = "needs root"]
fn containerd_runs_a_container_the_agent_attributes_and_enforces() {
    require_root();
    installed("runc");
    installed("containerd-shim-runc-v2");
    let (containerd, ctr) = (installed("containerd"), installed("ctr"));
    let engine = Containerd::start(&containerd, ctr);
    let pod = pod_uid("ctrd");
    let unit = pod.replace('-', "_");
    scenario(&Engine::Containerd(engine), ("containerd", &pod), |id| {
        format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{unit}.slice/\
             cri-containerd-{id}.scope"
        )
    });
}

/// One run: a quota for a container id that does not run yet; the runtime starts the container
/// in the cgroup `cgroup_path(id)`; the agent binds the quota there, attributes the client's
/// ioctls to the container, refuses it the other GPU and kills it past its memory limit; the
/// runtime's clean-up removes the cgroup and the quota waits again. `(runtime, pod)` is what the
/// agent should read from that path.
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn scenario(engine: &Engine, (runtime, pod): (&str, &str), cgroup_path: impl Fn(&str) -> String) {
    let rig = Rig::start(engine.name());
    let id = container_id(engine.name());
    let path = cgroup_path(&id);

    // Half a GPU and 16 MiB, `kill` past the limit, for the container to come.
    let session = rig.session(
        &["cuda.shares=0.5", "cuda.mem=16m"],
        pb::target::Kind::ContainerId(id.clone()),
        "kill",
    );
    rig.wait_binding(&session.id, "pending");
    let mine = session.devices[0].index;
    let other = 1 - mine;

    let bundle = Bundle::make(&rig.driver.dir, mine);
    let container = engine.run(&bundle, &id, &path);
    let mut client = container.client;
    assert_eq!(client.pid, 1, "the client is not the container's init");
    let snap = rig.wait_binding(&session.id, "bound");
    let binding = snap
        .bindings
        .iter()
        .find(|b| b.session_id == session.id)
        .unwrap();
    assert_eq!(binding.cgroup_path.as_deref(), Some(path.as_str()));
    let host_pid = engine.host_pid(&id);
    assert!(
        std::fs::read_to_string(format!("/proc/{host_pid}/cgroup"))
            .unwrap()
            .lines()
            .any(|l| l == format!("0::{path}")),
        "the runtime did not put its init in {path}"
    );

    // The runtime's own device rules let every node of the spec through (cgroup v1 devices
    // controller here): a refusal below is the agent's program, not the runtime's.
    let allowed =
        std::fs::read_to_string(format!("/sys/fs/cgroup/devices{path}/devices.list")).unwrap();
    for minor in [0, 1, 255] {
        let rule = format!("c {NVIDIA_MAJOR}:{minor} rwm");
        assert!(
            allowed.lines().any(|l| l == rule),
            "{rule} not in {allowed}"
        );
    }
    // The client's GPU and the control node pass the device check (and find no driver here);
    // the other GPU is refused by the agent's cgroup_device program.
    assert_eq!(
        open_errno(&mut client, &format!("/dev/nvidia{mine}")),
        libc::ENXIO
    );
    assert_eq!(open_errno(&mut client, "/dev/nvidiactl"), libc::ENXIO);
    assert_eq!(
        open_errno(&mut client, &format!("/dev/nvidia{other}")),
        libc::EPERM
    );

    // GPU memory through the fake driver's ioctls, under the limit.
    let h = client.value("client", "client");
    let dev = client.value(&format!("device {h:#x} {mine}"), "handle");
    client.ok(&format!("alloc {h:#x} {dev:#x} 12m"));
    let c = entry(&rig.agent().snapshot(), &path);
    assert_eq!(
        (
            c.container_id.as_deref(),
            c.runtime.as_str(),
            c.pod_uid.as_deref()
        ),
        (Some(id.as_str()), runtime, Some(pod))
    );
    assert_eq!(c.pids, vec![host_pid]);
    assert_eq!(c.session_id.as_deref(), Some(session.id.as_str()));
    assert_eq!(
        agent::memory(&c, &format!("nvidia{mine}")),
        12 * MIB,
        "{c:?}"
    );
    let e = c.enforcement.as_ref().unwrap();
    assert_eq!((e.denied_opens, e.actions), (1, 0));
    // The kernel's count is read from its map; the event comes through the ring buffer and the
    // enforcer, so it may reach a snapshot a moment later.
    let denied = |c: &Container| {
        c.events
            .iter()
            .any(|e| e.action == "device_denied" && e.device == Some(other) && e.pid == host_pid)
    };
    gpuwarden_test_support::wait::until("the denial event", Duration::from_secs(10), || {
        denied(&entry(&rig.agent().snapshot(), &path))
    });

    // 12 + 8 > 16: the container's init is killed at the ioctl, so the container ends.
    client.send_only(&format!("alloc {h:#x} {dev:#x} 8m"));
    let status = client.wait_within(Duration::from_secs(20));
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGKILL),
        "{} ended {status:?}",
        engine.name()
    );
    // The kill went up the agent's stream: the controller lists it on the session.
    let mut kill = None;
    rig.wait_for("the controller to list the kill", |r| {
        kill = r
            .get(&session.id)
            .events
            .into_iter()
            .find(|e| e.action == "kill");
        kill.is_some()
    });
    let kill = kill.unwrap();
    assert_eq!(
        (
            kill.pid,
            kill.container.as_str(),
            kill.device,
            kill.requested_bytes,
            kill.used_bytes,
            kill.limit_bytes
        ),
        (host_pid, path.as_str(), mine, 8 * MIB, 12 * MIB, 16 * MIB)
    );
    // The runtime removed the container's cgroup on its way out; the quota waits for the id
    // again.
    rig.wait_binding(&session.id, "pending");
    assert!(!Path::new(&format!("/sys/fs/cgroup/unified{path}")).exists());
    rig.wait_for("the controller to list the unbinding", |r| {
        r.get(&session.id)
            .events
            .iter()
            .any(|e| e.action == "unbound" && e.container == path)
    });
    drop(container.guard);
}

/// `path` opened by the client: 0, or the errno.
fn open_errno(client: &mut Client, path: &str) -> i32 {
    let reply = client.send(&format!("open {path}"));
    if reply.starts_with("ok") {
        return 0;
    }
    reply
        .strip_prefix("err errno=")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("open {path} answered {reply:?}"))
}

fn entry(snap: &Snapshot, path: &str) -> Container {
    snap.containers
        .iter()
        .find(|c| c.cgroup_path == path)
        .cloned()
        .unwrap_or_else(|| panic!("{path} not in {:?}", snap.containers))
}

/// The path of `program` on `PATH`. A root test never skips itself (it would pass having shown
/// nothing): without the program it fails, saying how to install it.
fn installed(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(program))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!("{program} is not installed: `cargo xtask setup` installs it (runc, containerd)")
        })
}

/// An OCI bundle: a root file system of the client and its libraries, and the runtime's default
/// spec with the GPU edits.
struct Bundle {
    dir: TempDir,
}

impl Bundle {
    /// The client runs `gpu-client --dir <driver> --gpu <gpu>` as the container's init; of the
    /// two GPUs, `gpu` is the one its quota holds.
    fn make(driver: &Path, gpu: u32) -> Self {
        let dir = scratch("bundle");
        let rootfs = dir.path().join("rootfs");
        let client = Path::new(env!("CARGO_BIN_EXE_gpu-client"));
        for sub in ["bin", "dev", "proc", "sys", "tmp"] {
            std::fs::create_dir_all(rootfs.join(sub)).unwrap();
        }
        std::fs::copy(client, rootfs.join("bin/gpu-client")).unwrap();
        for lib in libraries(client) {
            let to = rootfs.join(lib.strip_prefix("/").unwrap());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&lib, &to).unwrap();
        }
        // The runtime's defaults: namespaces, capabilities, mounts, device rules.
        run_ok(
            Command::new("runc")
                .args(["spec", "--bundle"])
                .arg(dir.path()),
        );
        let config = dir.path().join("config.json");
        let mut spec: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
        spec["root"]["path"] = json!(rootfs);
        spec["process"]["terminal"] = json!(false);
        spec["process"]["args"] =
            json!(["/bin/gpu-client", "--dir", driver, "--gpu", gpu.to_string()]);
        spec["mounts"].as_array_mut().unwrap().push(json!({
            "destination": driver,
            "type": "bind",
            "source": driver,
            "options": ["rbind", "rw"],
        }));
        // What a CDI spec's `deviceNodes` for the allocated GPU become (the agent's DRA spec
        // lists the claim's GPUs and the control nodes): a node the runtime makes in the
        // container's /dev, and a device cgroup rule that allows it.
        let made = [(format!("nvidia{gpu}"), gpu), ("nvidiactl".to_owned(), 255)];
        spec["linux"]["devices"] = made
            .iter()
            .map(|(name, minor)| {
                json!({
                    "path": format!("/dev/{name}"), "type": "c", "major": NVIDIA_MAJOR,
                    "minor": minor, "fileMode": 0o666, "uid": 0, "gid": 0,
                })
            })
            .collect();
        // The other GPU's node reaches the container anyway (a hand-written spec, a privileged
        // helper): made on the host, bind-mounted, and allowed by the runtime's rules, so only
        // the agent stands between the container and that GPU. Bind-mounted rather than listed
        // above: the runtime's mknod of it would race with the quota binding (docs/runtimes.md).
        let other = 1 - gpu;
        let host_node = dir.path().join(format!("nvidia{other}"));
        mknod(&host_node, NVIDIA_MAJOR, other);
        spec["mounts"].as_array_mut().unwrap().push(json!({
            "destination": format!("/dev/nvidia{other}"),
            "type": "bind",
            "source": host_node,
            "options": ["bind", "rw"],
        }));
        let rules = spec["linux"]["resources"]["devices"]
            .as_array_mut()
            .unwrap();
        for minor in [gpu, other, 255] {
            rules.push(json!({
                "allow": true, "type": "c", "major": NVIDIA_MAJOR, "minor": minor, "access": "rwm",
            }));
        }
        std::fs::write(&config, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        Self { dir }
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("config.json")
    }
}

/// The shared libraries `ldd` lists for `binary`, the loader included.
fn libraries(binary: &Path) -> Vec<PathBuf> {
    let out = run_ok(Command::new("ldd").arg(binary));
    out.split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// Runs `cmd` to success and returns its stdout.
fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The runtime under test.
enum Engine {
    Runc {
        runc: PathBuf,
        /// runc's state directory (`--root`), the test's own.
        root: PathBuf,
    },
    Containerd(Containerd),
}

/// A running container: the client as its init, and what removes it.
struct Running {
    client: Client,
    guard: Removal,
}

impl Engine {
    fn name(&self) -> &'static str {
        match self {
            Self::Runc { .. } => "runc",
            Self::Containerd(_) => "containerd",
        }
    }

    /// Starts container `id` of `bundle` in cgroup `cgroup_path`, in the foreground.
    fn run(&self, bundle: &Bundle, id: &str, cgroup_path: &str) -> Running {
        let config = bundle.config();
        let mut spec: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
        spec["linux"]["cgroupsPath"] = json!(cgroup_path);
        std::fs::write(&config, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        let guard = Removal {
            command: self.remove_command(id),
            cgroup_path: cgroup_path.to_owned(),
        };
        let mut cmd = match self {
            Self::Runc { runc, root } => {
                let mut cmd = Command::new(runc);
                cmd.arg("--root")
                    .arg(root)
                    .args(["run", "--bundle"])
                    .arg(bundle.dir.path())
                    .arg(id);
                cmd
            }
            Self::Containerd(c) => {
                let mut cmd = c.ctr();
                cmd.args(["run", "--rm", "--config"]).arg(&config).arg(id);
                cmd
            }
        };
        cmd.stderr(Stdio::inherit());
        Running {
            client: Client::start(cmd),
            guard,
        }
    }

    /// The host pid of container `id`'s init, as the runtime reports it.
    fn host_pid(&self, id: &str) -> u32 {
        match self {
            Self::Runc { runc, root } => {
                let state = run_ok(
                    Command::new(runc)
                        .arg("--root")
                        .arg(root)
                        .args(["state", id]),
                );
                let state: Value = serde_json::from_str(&state).unwrap();
                u32::try_from(state["pid"].as_u64().unwrap()).unwrap()
            }
            Self::Containerd(c) => {
                // `TASK  PID  STATUS`
                let tasks = run_ok(c.ctr().args(["task", "ls"]));
                tasks
                    .lines()
                    .find_map(|l| {
                        let mut words = l.split_whitespace();
                        (words.next() == Some(id))
                            .then(|| words.next().and_then(|p| p.parse().ok()))
                            .flatten()
                    })
                    .unwrap_or_else(|| panic!("{id} not in {tasks}"))
            }
        }
    }

    /// The commands that remove container `id` whatever state it is in.
    fn remove_command(&self, id: &str) -> Vec<Command> {
        match self {
            Self::Runc { runc, root } => {
                let mut delete = Command::new(runc);
                delete
                    .arg("--root")
                    .arg(root)
                    .args(["delete", "--force", id]);
                vec![delete]
            }
            Self::Containerd(c) => {
                let mut task = c.ctr();
                task.args(["task", "delete", "--force", id]);
                let mut container = c.ctr();
                container.args(["container", "delete", id]);
                vec![task, container]
            }
        }
    }
}

/// Removes a container when dropped, so a failing test leaves none running, and the parent
/// cgroups the runtime made for it (it removes only the container's own).
struct Removal {
    command: Vec<Command>,
    cgroup_path: String,
}

impl Drop for Removal {
    fn drop(&mut self) {
        for cmd in &mut self.command {
            // Already gone when the test got this far: the errors say so and don't matter.
            let _ = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
        let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
            return;
        };
        let hierarchies: Vec<PathBuf> = hierarchies.flatten().map(|e| e.path()).collect();
        let mut path = Path::new(self.cgroup_path.trim_start_matches('/'));
        while let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            path = parent;
            for h in &hierarchies {
                // Fails, harmlessly, where another test's cgroup is still inside.
                let _ = std::fs::remove_dir(h.join(path));
            }
        }
    }
}

/// A containerd daemon of the test's own: its root, state and sockets in a scratch directory,
/// without the CRI plugin; stopped when dropped.
struct Containerd {
    daemon: Child,
    ctr: PathBuf,
    socket: PathBuf,
    dir: TempDir,
}

impl Containerd {
    /// The namespace the test's containers live in.
    const NAMESPACE: &str = "gpuwarden-test";

    fn start(containerd: &Path, ctr: PathBuf) -> Self {
        let dir = scratch("ctrd");
        let socket = dir.path().join("c.sock");
        let config = dir.path().join("config.toml");
        let d = dir.path().display();
        std::fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{d}/root\"\nstate = \"{d}/state\"\n\
                 disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
                 [grpc]\n  address = \"{d}/c.sock\"\n\
                 [ttrpc]\n  address = \"{d}/c.ttrpc\"\n"
            ),
        )
        .unwrap();
        let daemon = Command::new(containerd)
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
            .spawn()
            .unwrap();
        let c = Self {
            daemon,
            ctr,
            socket,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !c
            .ctr()
            .arg("version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            assert!(
                Instant::now() < deadline,
                "containerd did not answer: {}",
                std::fs::read_to_string(c.dir.path().join("log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        c
    }

    /// `ctr` speaking to this daemon, in the test's namespace.
    fn ctr(&self) -> Command {
        let mut cmd = Command::new(&self.ctr);
        cmd.arg("--address")
            .arg(&self.socket)
            .args(["--namespace", Self::NAMESPACE]);
        cmd
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // SIGTERM: containerd shuts down cleanly (a shim of a removed task is gone already).
        // SAFETY: a plain syscall on our own child's pid.
        unsafe {
            libc::kill(
                i32::try_from(self.daemon.id()).unwrap_or(i32::MAX),
                libc::SIGTERM,
            );
        }
        let _ = self.daemon.wait();
    }
}
