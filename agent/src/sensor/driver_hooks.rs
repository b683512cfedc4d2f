//! Trials of the driver hooks (`gpuwarden-agent probe-hooks`): whether the most targeted tier
//! would load on this kernel.

use super::{
    Btf, EbpfLoader, FEntry, KProbe, OBJECT, Path, ProgramError, error_chain, probe,
    raise_memlock_limit,
};

/// The driver's ioctl entry point (`file_operations.unlocked_ioctl` of `nvidia.ko`).
const DRIVER_IOCTL: &str = "nvidia_unlocked_ioctl";
/// A core kernel function every kernel has, to learn whether fentry loads at all.
const CORE_FUNCTION: &str = "do_sys_openat2";

/// Tries to load and attach each driver hook (and an fentry on a core kernel function), for
/// `gpuwarden-agent probe-hooks`: whether the most targeted tier would load on this kernel. The
/// programs count nothing and are detached on return.
#[must_use]
pub fn try_driver_hooks() -> Vec<probe::HookTrial> {
    raise_memlock_limit();
    let trial = |hook: &str, target: &str, result: Result<(), String>| probe::HookTrial {
        hook: hook.to_owned(),
        target: target.to_owned(),
        loaded: result.is_ok(),
        detail: result
            .err()
            .unwrap_or_else(|| "loaded and attached".to_owned()),
    };
    // Each attempt gets its own copy of the object: a program loads once.
    let fresh = || EbpfLoader::new().load(OBJECT).map_err(|e| error_chain(&e));
    let kprobe = fresh().and_then(|mut ebpf| {
        let program: &mut KProbe = ebpf
            .program_mut("driver_kprobe")
            .ok_or("not in the object")?
            .try_into()
            .map_err(|e: ProgramError| e.to_string())?;
        program.load().map_err(|e| error_chain(&e))?;
        program
            .attach(DRIVER_IOCTL, 0)
            .map(drop)
            .map_err(|e| error_chain(&e))
    });
    let fentry = |target: &str, btf: Result<Btf, String>| {
        fresh().and_then(|mut ebpf| {
            let btf = btf?;
            let program: &mut FEntry = ebpf
                .program_mut("driver_fentry")
                .ok_or("not in the object")?
                .try_into()
                .map_err(|e: ProgramError| e.to_string())?;
            program.load(target, &btf).map_err(|e| error_chain(&e))?;
            program.attach().map(drop).map_err(|e| error_chain(&e))
        })
    };
    let vmlinux = || Btf::from_sys_fs().map_err(|e| format!("no kernel BTF: {e}"));
    let module = || {
        let path = Path::new("/sys/kernel/btf/nvidia");
        if path.exists() {
            Btf::parse_file(path, aya::Endianness::default())
                .map_err(|e| format!("the nvidia module's BTF can't be read: {e}"))
        } else {
            Err("no BTF for the nvidia module (/sys/kernel/btf/nvidia)".to_owned())
        }
    };
    vec![
        trial("driver_kprobe", DRIVER_IOCTL, kprobe),
        trial(
            "driver_fentry",
            DRIVER_IOCTL,
            fentry(DRIVER_IOCTL, module()),
        ),
        trial(
            "vmlinux_fentry",
            CORE_FUNCTION,
            fentry(CORE_FUNCTION, vmlinux()),
        ),
    ]
}
