use super::*;

/// A config file holding `text`, in a scratch directory removed with the returned guard.
fn write(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = gpuwarden_test_support::scratch(&format!("config-{name}"));
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

#[test]
fn flags_win_over_the_file() {
    let (_dir, path) = write(
        "ok",
        "gpu_devices = [\"/dev/nvidia0\"]\nsocket = \"/tmp/a.sock\"\n",
    );
    let config = AgentConfig::load(
        Some(&path),
        Overrides {
            socket: Some(PathBuf::from("/tmp/b.sock")),
            ..Overrides::default()
        },
    )
    .unwrap();
    assert_eq!(config.socket, PathBuf::from("/tmp/b.sock"));
    assert_eq!(config.gpu_globs.as_slice(), ["/dev/nvidia0"]);
}

#[test]
fn usage_reports_default_to_five_seconds_and_zero_turns_them_off() {
    let (_dir, path) = write("usage", "usage_report_interval_ms = 250\n");
    let from_file = AgentConfig::load(Some(&path), Overrides::default()).unwrap();
    assert_eq!(
        from_file.usage_report_interval,
        Some(Duration::from_millis(250))
    );
    let flag = |ms| {
        AgentConfig::load(
            Some(&path),
            Overrides {
                usage_report_interval_ms: Some(ms),
                ..Overrides::default()
            },
        )
        .unwrap()
        .usage_report_interval
    };
    assert_eq!(flag(0), None);
    assert_eq!(flag(1), Some(Duration::from_millis(100)));
    let default = AgentConfig::load(None, Overrides::default()).unwrap();
    assert_eq!(default.usage_report_interval, Some(Duration::from_secs(5)));
}

#[test]
fn kubelet_settings_come_from_the_file() {
    let (_dir, path) = write(
        "kubelet",
        "kubelet_url = \"https://10.0.0.5:10250/pods\"\nkubelet_ca_file = \"/etc/ca.pem\"\nkubelet_insecure_skip_tls_verify = true\n",
    );
    let kubelet = AgentConfig::load(Some(&path), Overrides::default())
        .unwrap()
        .kubelet
        .unwrap();
    assert_eq!(kubelet.url, "https://10.0.0.5:10250/pods");
    assert_eq!(kubelet.ca_file, Some(PathBuf::from("/etc/ca.pem")));
    assert!(kubelet.insecure_skip_tls_verify);

    // An empty URL turns pod names off, whatever the environment says.
    let (_dir, path) = write("nokubelet", "kubelet_url = \"\"\n");
    let config = AgentConfig::load(Some(&path), Overrides::default()).unwrap();
    assert_eq!(config.kubelet, None);
}

#[test]
fn unknown_keys_and_bad_globs_are_named() {
    let (_dir, path) = write("bad", "gpu_device = [\"/dev/nvidia0\"]\n");
    let err = AgentConfig::load(Some(&path), Overrides::default()).unwrap_err();
    let msg = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("gpu_device"), "{msg}");

    let err = AgentConfig::load(
        None,
        Overrides {
            gpu_devices: Some(vec!["nvidia*".to_owned()]),
            ..Overrides::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("absolute"), "{err}");
}

#[test]
fn controller_tls_files_come_from_the_file_and_flags_win() {
    let (_dir, path) = write(
        "tls",
        "controller = \"https://ctl:50051\"\ncontroller_ca = \"/etc/gw/ca.pem\"\ntls_cert = \"/etc/gw/node.pem\"\ntls_key = \"/etc/gw/node.key\"\n",
    );
    let config = AgentConfig::load(
        Some(&path),
        Overrides {
            tls_cert: Some(PathBuf::from("/run/gw/rotated.pem")),
            ..Overrides::default()
        },
    )
    .unwrap();
    assert_eq!(
        config.controller_tls,
        ClientTls {
            ca: Some(PathBuf::from("/etc/gw/ca.pem")),
            cert: Some(PathBuf::from("/run/gw/rotated.pem")),
            key: Some(PathBuf::from("/etc/gw/node.key")),
        }
    );
}

#[test]
fn the_socket_group_is_resolved_at_load_and_an_unknown_one_named() {
    let (_dir, path) = write("agent.toml", "socket_group = \"root\"\n");
    let config = AgentConfig::load(Some(&path), Overrides::default()).unwrap();
    assert_eq!(config.socket_group, Some(0));
    let (_dir, path) = write("agent.toml", "socket_group = \"4242\"\n");
    let config = AgentConfig::load(Some(&path), Overrides::default()).unwrap();
    assert_eq!(config.socket_group, Some(4242));
    let (_dir, path) = write("agent.toml", "socket_group = \"no-such-group-gw\"\n");
    let err = AgentConfig::load(Some(&path), Overrides::default()).unwrap_err();
    assert!(
        matches!(err, ConfigError::SocketGroup { .. })
            && err.to_string().contains("no-such-group-gw"),
        "{err}"
    );
    let config = AgentConfig::load(None, Overrides::default()).unwrap();
    assert_eq!(config.socket_group, None, "root only by default");
}

/// The `agent.toml` blocks of YAML `text` (a `ConfigMap`'s `agent.toml: |` and the lines indented
/// under it, in a manifest or in a kustomize patch).
fn embedded_agent_tomls(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(key_at) = line.find("agent.toml: |") else {
            continue;
        };
        let mut block = Vec::new();
        while let Some(next) = lines.peek() {
            let indent = next.len() - next.trim_start().len();
            if !next.trim().is_empty() && indent <= key_at {
                break;
            }
            block.push(*next);
            lines.next();
        }
        let strip = block
            .iter()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.len() - l.trim_start().len())
            .min()
            .unwrap_or(0);
        found.push(
            block
                .iter()
                .map(|l| l.get(strip..).unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
    found
}

/// Every agent config the Kubernetes manifests ship (the base and each overlay's) loads with
/// the agent's own parser, which refuses unknown keys: a key that drifted would crash-loop the
/// `DaemonSet`.
#[test]
fn the_manifests_agent_configs_load() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let mut pending = vec![deploy];
    let mut loaded = 0;
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (i, toml) in embedded_agent_tomls(&text).into_iter().enumerate() {
                let (_dir, file) = write(&format!("manifest-{loaded}"), &toml);
                let config = AgentConfig::load(Some(&file), Overrides::default());
                // In a pod the API server comes from the environment the kubelet sets; here
                // there is none, and that is the only failure allowed.
                let in_cluster_only = matches!(
                    config,
                    Err(ConfigError::Dra(
                        crate::dra::config::DraConfigError::NoApiServer
                    ))
                ) && std::env::var_os("KUBERNETES_SERVICE_HOST").is_none();
                assert!(
                    config.is_ok() || in_cluster_only,
                    "{} (agent.toml #{i}): {:?}\n{toml}",
                    path.display(),
                    config.err()
                );
                loaded += 1;
            }
        }
    }
    // The base DaemonSet's config and the DRA overlay's, at least.
    assert!(loaded >= 2, "found {loaded} agent.toml blocks");
}

#[test]
fn the_prometheus_endpoint_is_off_unless_asked_for() {
    let default = AgentConfig::load(None, Overrides::default()).unwrap();
    assert_eq!(default.prometheus_listen, None);
    let (_dir, path) = write("prometheus", "prometheus_listen = \"127.0.0.1:9464\"\n");
    let from_file = AgentConfig::load(Some(&path), Overrides::default()).unwrap();
    assert_eq!(
        from_file.prometheus_listen,
        Some("127.0.0.1:9464".parse().unwrap())
    );
    let flag = AgentConfig::load(
        Some(&path),
        Overrides {
            prometheus_listen: Some("0.0.0.0:9100".parse().unwrap()),
            prometheus_insecure: Some(true),
            ..Overrides::default()
        },
    )
    .unwrap();
    assert_eq!(
        flag.prometheus_listen,
        Some("0.0.0.0:9100".parse().unwrap())
    );
}

#[test]
fn the_prometheus_endpoint_beyond_loopback_is_refused_unless_allowed() {
    let beyond = |file: &str, flag: Option<bool>| {
        let (_dir, path) = write("prometheus-remote", file);
        AgentConfig::load(
            Some(&path),
            Overrides {
                prometheus_insecure: flag,
                ..Overrides::default()
            },
        )
    };
    let err = beyond("prometheus_listen = \"0.0.0.0:9464\"\n", None)
        .expect_err("a wildcard address is refused");
    let message = err.to_string();
    assert!(message.contains("0.0.0.0:9464"), "{message}");
    assert!(message.contains("--prometheus-insecure"), "{message}");
    assert!(
        beyond("prometheus_listen = \"10.1.2.3:9464\"\n", Some(false)).is_err(),
        "an explicit false refuses too"
    );
    // Allowed by the flag or by the file's key; loopback needs neither.
    let by_flag = beyond("prometheus_listen = \"0.0.0.0:9464\"\n", Some(true)).unwrap();
    assert_eq!(
        by_flag.prometheus_listen,
        Some("0.0.0.0:9464".parse().unwrap())
    );
    beyond(
        "prometheus_listen = \"10.1.2.3:9464\"\nprometheus_insecure = true\n",
        None,
    )
    .unwrap();
    beyond("prometheus_listen = \"[::1]:9464\"\n", None).unwrap();
}

#[test]
fn slots_are_charged_as_held_unless_the_file_says_busy() {
    use crate::enforcement::throttle::Charge;
    let default = AgentConfig::load(None, Overrides::default()).unwrap();
    assert_eq!(default.throttle.slots.charge, Charge::Held);
    let (_dir, path) = write("charge", "throttle_charge = \"busy\"\n");
    let busy = AgentConfig::load(Some(&path), Overrides::default()).unwrap();
    assert_eq!(busy.throttle.slots.charge, Charge::Busy);
    let (_dir, path) = write("charge-bad", "throttle_charge = \"used\"\n");
    let err = AgentConfig::load(Some(&path), Overrides::default()).unwrap_err();
    assert!(format!("{err:#}").contains("throttle_charge"), "{err:#}");
}

#[test]
fn no_gpu_is_reconfigurable_unless_listed() {
    let none = AgentConfig::load(None, Overrides::default()).unwrap();
    assert!(none.mig_reconfigurable.is_empty());
    let (_dir, path) = write(
        "mig",
        "mig_reconfigurable = [\"GPU-a\", \" GPU-b \", \"\"]\n",
    );
    let from_file = AgentConfig::load(Some(&path), Overrides::default()).unwrap();
    assert_eq!(from_file.mig_reconfigurable, ["GPU-a", "GPU-b"]);
    let flag = AgentConfig::load(
        Some(&path),
        Overrides {
            mig_reconfigurable: Some(vec!["GPU-c".into()]),
            ..Overrides::default()
        },
    )
    .unwrap();
    assert_eq!(flag.mig_reconfigurable, ["GPU-c"]);
}
