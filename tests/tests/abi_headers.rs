//! The NVIDIA ABI tables held to NVIDIA's own headers, mechanically.
//!
//! `tests/tests/abi/nvidia_layout.c` includes the headers vendored under
//! `tests/vendor/open-gpu-kernel-modules` (MIT) and prints every `sizeof`, `offsetof` and
//! constant the fake driver, the synthetic client and the agent's decoder use. This test
//! compiles it with the system C compiler, runs it, and compares each line with both the
//! test side's table (`gpuwarden_tests::abi::nvidia`) and the product's
//! (`gpuwarden_agent_common::nvidia`): a wrong offset in either fails here, by name.

use std::{collections::BTreeMap, path::Path, process::Command};

use gpuwarden_agent_common::nvidia as product;
use gpuwarden_tests::abi::{self, nvidia as test_side};

/// (name, test side's value, product's value) for every name both tables give.
macro_rules! both {
    ($($m:ident :: $c:ident),* $(,)?) => {
        vec![$((
            concat!(stringify!($m), ".", stringify!($c)),
            u64::try_from(test_side::$m::$c).expect("fits"),
            u64::try_from(product::$m::$c).expect("fits"),
        )),*]
    };
}

/// What the headers say: name → value.
fn from_headers() -> BTreeMap<String, u64> {
    run_layout("tests/abi/nvidia_layout.c")
}

/// Compiles and runs the layout program `source` (relative to the crate) against the vendored
/// headers: name → value.
fn run_layout(source: &str) -> BTreeMap<String, u64> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let vendor = root.join("vendor/open-gpu-kernel-modules");
    let dir = tempfile::tempdir().expect("a scratch dir");
    let exe = dir.path().join("nvidia_layout");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(vendor.join("src/common/sdk/nvidia/inc"))
        .arg("-I")
        .arg(vendor.join("src/nvidia/arch/nvalloc/unix/include"))
        .arg(root.join(source))
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("a C compiler (cc) runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe)
        .output()
        .expect("the layout program runs");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .expect("text")
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').expect("name value");
            (k.to_owned(), v.parse().expect("a number"))
        })
        .collect()
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn both_tables_match_nvidias_headers_field_by_field() {
    let headers = from_headers();
    let mut rows = both![
        esc::RM_ALLOC_MEMORY,
        esc::RM_FREE,
        esc::RM_CONTROL,
        esc::RM_ALLOC,
        esc::RM_DUP_OBJECT,
        esc::RM_SHARE,
        esc::RM_I2C_ACCESS,
        esc::RM_IDLE_CHANNELS,
        esc::RM_VID_HEAP_CONTROL,
        esc::RM_ACCESS_REGISTRY,
        esc::RM_MAP_MEMORY,
        esc::RM_UNMAP_MEMORY,
        esc::RM_GET_EVENT_DATA,
        esc::RM_ALLOC_CONTEXT_DMA2,
        esc::RM_ADD_VBLANK_CALLBACK,
        esc::RM_MAP_MEMORY_DMA,
        esc::RM_UNMAP_MEMORY_DMA,
        esc::RM_BIND_CONTEXT_DMA,
        esc::RM_EXPORT_OBJECT_TO_FD,
        esc::RM_IMPORT_OBJECT_FROM_FD,
        esc::RM_UPDATE_DEVICE_MAPPING_INFO,
        esc::CARD_INFO,
        esc::REGISTER_FD,
        esc::ALLOC_OS_EVENT,
        esc::FREE_OS_EVENT,
        esc::STATUS_CODE,
        esc::CHECK_VERSION_STR,
        esc::IOCTL_XFER_CMD,
        esc::ATTACH_GPUS_TO_FD,
        esc::QUERY_DEVICE_INTR,
        esc::SYS_PARAMS,
        esc::EXPORT_TO_DMABUF_FD,
        esc::WAIT_OPEN_COMPLETE,
        xfer::SIZE,
        xfer::CMD,
        xfer::PARAMS_SIZE,
        xfer::PTR,
        nvos21::SIZE,
        nvos21::H_ROOT,
        nvos21::H_OBJECT_PARENT,
        nvos21::H_OBJECT_NEW,
        nvos21::H_CLASS,
        nvos21::P_ALLOC_PARMS,
        nvos21::PARAMS_SIZE,
        nvos21::STATUS,
        nvos64::SIZE,
        nvos64::H_ROOT,
        nvos64::H_OBJECT_PARENT,
        nvos64::H_OBJECT_NEW,
        nvos64::H_CLASS,
        nvos64::P_ALLOC_PARMS,
        nvos64::P_RIGHTS_REQUESTED,
        nvos64::PARAMS_SIZE,
        nvos64::FLAGS,
        nvos64::STATUS,
        nvos00::SIZE,
        nvos00::H_ROOT,
        nvos00::H_OBJECT_PARENT,
        nvos00::H_OBJECT_OLD,
        nvos00::STATUS,
        nvos54::SIZE,
        nvos54::H_CLIENT,
        nvos54::H_OBJECT,
        nvos54::CMD,
        nvos54::FLAGS,
        nvos54::PARAMS,
        nvos54::PARAMS_SIZE,
        nvos54::STATUS,
        nvos02::SIZE,
        nvos02::H_ROOT,
        nvos02::H_OBJECT_PARENT,
        nvos02::H_OBJECT_NEW,
        nvos02::H_CLASS,
        nvos02::FLAGS,
        nvos02::P_MEMORY,
        nvos02::LIMIT,
        nvos02::STATUS,
        nvos02::FD,
        nvos02::FLAGS_LOCATION_SHIFT,
        nvos02::FLAGS_LOCATION_MASK,
        nvos02::LOCATION_PCI,
        nvos02::LOCATION_VIDMEM,
        nvos02::FLAGS_ALLOC_SHIFT,
        nvos02::ALLOC_NONE,
        nvos02::FLAGS_MAPPING_SHIFT,
        nvos02::MAPPING_NO_MAP,
        nvos32::SIZE,
        nvos32::H_ROOT,
        nvos32::H_OBJECT_PARENT,
        nvos32::FUNCTION,
        nvos32::STATUS,
        nvos32::ALLOC_OWNER,
        nvos32::H_MEMORY,
        nvos32::ALLOC_TYPE,
        nvos32::ALLOC_FLAGS,
        nvos32::ALLOC_ATTR,
        nvos32::ALLOC_SIZE,
        nvos32::FUNCTION_ALLOC_SIZE,
        nvos32::FUNCTION_FREE,
        nvos32::FLAGS_MEMORY_HANDLE_PROVIDED,
        nvos32::FLAGS_VIRTUAL,
        nvos32::ATTR_LOCATION_SHIFT,
        nvos32::ATTR_LOCATION_MASK,
        nvos32::LOCATION_VIDMEM,
        nvos32::LOCATION_PCI,
        nvos32::LOCATION_ANY,
        memory_alloc::SIZE,
        memory_alloc::SIZE_OLD,
        memory_alloc::OWNER,
        memory_alloc::TYPE,
        memory_alloc::FLAGS,
        memory_alloc::ATTR,
        memory_alloc::SIZE_FIELD,
        memory_alloc::H_VA_SPACE,
        memory_alloc::FLAGS_VIRTUAL,
        memory_alloc::ATTR_LOCATION_SHIFT,
        memory_alloc::ATTR_LOCATION_MASK,
        memory_alloc::ATTR_LOCATION_VIDMEM,
        memory_alloc::ATTR_LOCATION_PCI,
        device_alloc::DEVICE_ID,
        subdevice_alloc::SUBDEVICE_ID,
        class::ROOT,
        class::ROOT_NON_PRIV,
        class::ROOT_CLIENT,
        class::MEMORY_SYSTEM,
        class::MEMORY_LOCAL_USER,
        class::MEMORY_VIRTUAL,
        class::MEMORY_SYSTEM_OS_DESCRIPTOR,
        class::DEVICE_0,
        class::SUBDEVICE_0,
        class::NV50_MEMORY_VIRTUAL,
        status::OK,
        status::NO_MEMORY,
        status::INSUFFICIENT_RESOURCES,
        status::INVALID_ARGUMENT,
        status::INSERT_DUPLICATE_NAME,
        status::INVALID_CLIENT,
        status::INVALID_OBJECT_HANDLE,
        status::INVALID_OBJECT_PARENT,
        status::INVALID_CLASS,
        status::INVALID_FLAGS,
        status::NOT_SUPPORTED
    ];
    // `data.Free.hMemory` shares `data.AllocSize.hMemory`'s offset; the product names it once.
    rows.push((
        "nvos32.FREE_H_MEMORY",
        u64::try_from(test_side::nvos32::FREE_H_MEMORY).expect("fits"),
        u64::try_from(product::nvos32::H_MEMORY).expect("fits"),
    ));
    rows.push((
        "NV_IOCTL_MAGIC",
        u64::from(test_side::NV_IOCTL_MAGIC),
        u64::from(product::NV_IOCTL_MAGIC),
    ));
    // What only the test side describes (the agent never decodes it): held to the headers too,
    // with the product's column left out.
    let test_only: Vec<(&str, u64)> = vec![
        (
            "status.INSUFFICIENT_PERMISSIONS",
            u64::from(test_side::status::INSUFFICIENT_PERMISSIONS),
        ),
        (
            "status.INVALID_STATE",
            u64::from(test_side::status::INVALID_STATE),
        ),
        (
            "ctrl.GPU_GET_ATTACHED_IDS",
            u64::from(abi::ctrl::GPU_GET_ATTACHED_IDS),
        ),
        (
            "ctrl.ATTACHED_IDS_SIZE",
            u64::from(abi::ctrl::ATTACHED_IDS_SIZE),
        ),
        (
            "ctrl.MAX_ATTACHED_GPUS",
            u64::try_from(abi::ctrl::MAX_ATTACHED_GPUS).expect("fits"),
        ),
        ("ctrl.INVALID_GPU_ID", u64::from(abi::ctrl::INVALID_GPU_ID)),
        ("card_info.SIZE", u64::from(abi::card_info::SIZE)),
        (
            "card_info.VALID",
            u64::try_from(abi::card_info::VALID).expect("fits"),
        ),
        (
            "card_info.PCI_DOMAIN",
            u64::try_from(abi::card_info::PCI_DOMAIN).expect("fits"),
        ),
        (
            "card_info.PCI_BUS",
            u64::try_from(abi::card_info::PCI_BUS).expect("fits"),
        ),
        (
            "card_info.PCI_VENDOR_ID",
            u64::try_from(abi::card_info::PCI_VENDOR_ID).expect("fits"),
        ),
        (
            "card_info.PCI_DEVICE_ID",
            u64::try_from(abi::card_info::PCI_DEVICE_ID).expect("fits"),
        ),
        (
            "card_info.GPU_ID",
            u64::try_from(abi::card_info::GPU_ID).expect("fits"),
        ),
        (
            "card_info.FB_SIZE",
            u64::try_from(abi::card_info::FB_SIZE).expect("fits"),
        ),
        (
            "card_info.MINOR_NUMBER",
            u64::try_from(abi::card_info::MINOR_NUMBER).expect("fits"),
        ),
        ("version.SIZE", u64::from(abi::version::SIZE)),
        (
            "version.REPLY",
            u64::try_from(abi::version::REPLY).expect("fits"),
        ),
        (
            "version.REPLY_RECOGNIZED",
            u64::from(abi::version::REPLY_RECOGNIZED),
        ),
    ];
    let mut wrong = Vec::new();
    for &(name, test_value) in &test_only {
        match headers.get(name) {
            None => wrong.push(format!("{name}: not printed by nvidia_layout.c")),
            Some(&truth) if truth != test_value => {
                wrong.push(format!("{name}: test side {test_value}, headers {truth}"));
            }
            Some(_) => {}
        }
    }
    for &(name, test_value, product_value) in &rows {
        let Some(&truth) = headers.get(name) else {
            wrong.push(format!("{name}: not printed by nvidia_layout.c"));
            continue;
        };
        if test_value != truth {
            wrong.push(format!("{name}: test side {test_value}, headers {truth}"));
        }
        if product_value != truth {
            wrong.push(format!("{name}: PRODUCT {product_value}, headers {truth}"));
        }
    }
    let compared: Vec<&str> = rows
        .iter()
        .map(|r| r.0)
        .chain(test_only.iter().map(|r| r.0))
        .collect();
    for name in headers.keys() {
        if !compared.contains(&name.as_str()) {
            wrong.push(format!("{name}: printed but compared with neither table"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The encoded commands libcuda issues, from the headers' sizes: both tables build the same.
#[test]
fn the_encoded_commands_agree() {
    let headers = from_headers();
    for (escape, size) in [
        ("esc.RM_ALLOC", "nvos21.SIZE"),
        ("esc.RM_ALLOC", "nvos64.SIZE"),
        ("esc.RM_FREE", "nvos00.SIZE"),
        ("esc.RM_CONTROL", "nvos54.SIZE"),
        ("esc.RM_ALLOC_MEMORY", "nvos02.SIZE"),
        ("esc.RM_VID_HEAP_CONTROL", "nvos32.SIZE"),
        ("esc.IOCTL_XFER_CMD", "xfer.SIZE"),
    ] {
        let nr = u32::try_from(headers[escape]).expect("u32");
        let bytes = u32::try_from(headers[size]).expect("u32");
        let want = (3 << 30) | (bytes << 16) | (u32::from(b'F') << 8) | nr;
        assert_eq!(test_side::ioctl_cmd(nr, bytes), want, "{escape} {size}");
        assert_eq!(product::ioctl_cmd(nr, bytes), want, "{escape} {size}");
    }
    assert_eq!(
        test_side::ioctl_cmd(0x2b, 32),
        0xC020_462B,
        "RM_ALLOC with NVOS21"
    );
}
