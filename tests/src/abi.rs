//! ABI details only the test peers need: the agent never decodes these, so they live here rather
//! than in `gpuwarden_agent_common::nvidia`.
//!
//! Sources: NVIDIA's open-gpu-kernel-modules (`nv-ioctl.h`, `ctrl0000gpu.h`,
//! `nvidia-uvm/uvm_ioctl.h`, `uvm_linux_ioctl.h`). Offsets are little-endian byte offsets.
//!
//! [`nvidia`] is the test side's own description of the structures the agent does decode,
//! checked against NVIDIA's headers rather than copied from the product.

pub mod nvidia;

/// `RM_CONTROL` commands the fake driver answers with data.
pub mod ctrl {
    /// `NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS` (on the client): `NvU32 gpuIds[32]`.
    pub const GPU_GET_ATTACHED_IDS: u32 = 0x201;
    /// Size of `NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS`.
    pub const ATTACHED_IDS_SIZE: u32 = 128;
    /// `NV0000_CTRL_GPU_MAX_ATTACHED_GPUS`.
    pub const MAX_ATTACHED_GPUS: usize = 32;
    /// `NV0000_CTRL_GPU_INVALID_ID`: ends the list of attached ids.
    pub const INVALID_GPU_ID: u32 = 0xffff_ffff;
    /// `NV2080_CTRL_CMD_GPU_GET_NAME_STRING` (on a subdevice), for scripts that want a real id.
    pub const GPU_GET_NAME_STRING: u32 = 0x2080_0110;
}

/// `nv_ioctl_card_info_t` (72 bytes per card), the params of `CARD_INFO`.
pub mod card_info {
    /// Size of one entry.
    pub const SIZE: u32 = 72;
    /// `valid` (`NvBool`).
    pub const VALID: usize = 0;
    /// `pci_info.domain`.
    pub const PCI_DOMAIN: usize = 4;
    /// `pci_info.bus` (u8).
    pub const PCI_BUS: usize = 8;
    /// `pci_info.vendor_id` (u16).
    pub const PCI_VENDOR_ID: usize = 12;
    /// `pci_info.device_id` (u16).
    pub const PCI_DEVICE_ID: usize = 14;
    /// `gpu_id`.
    pub const GPU_ID: usize = 16;
    /// `fb_size` (u64).
    pub const FB_SIZE: usize = 48;
    /// `minor_number`.
    pub const MINOR_NUMBER: usize = 56;
}

/// `nv_ioctl_rm_api_version_t` (72 bytes), the params of `CHECK_VERSION_STR`.
pub mod version {
    /// Size of the struct.
    pub const SIZE: u32 = 72;
    /// `reply`.
    pub const REPLY: usize = 4;
    /// `NV_RM_API_VERSION_REPLY_RECOGNIZED`.
    pub const REPLY_RECOGNIZED: u32 = 1;
}

/// Parameter layouts of `/dev/nvidia-uvm` commands.
///
/// Every UVM params struct ends in `NV_STATUS rmStatus`, but where depends on the command and,
/// for some, on the driver version (`UVM_MAX_GPUS` grew from 32 to 256; `UVM_MIGRATE` and
/// `UVM_SET_PREFERRED_LOCATION` gained fields; copies of `UVM_FREE_PARAMS` without `length`
/// exist). [`rm_status_offset`](uvm_params::rm_status_offset) names only the offsets that don't
/// move between the header versions compared.
pub mod uvm_params {
    use super::nvidia::uvm;

    /// `UVM_INITIALIZE_PARAMS`: `{u64 flags; u32 rmStatus}`.
    pub mod initialize {
        /// Size of the struct.
        pub const SIZE: usize = 16;
        /// `flags`.
        pub const FLAGS: usize = 0;
        /// `rmStatus`.
        pub const RM_STATUS: usize = 8;
    }

    /// `UVM_CREATE_EXTERNAL_RANGE_PARAMS`, and `UVM_FREE_PARAMS` as NVIDIA's headers have it:
    /// `{u64 base; u64 length; u32 rmStatus}`.
    pub mod range {
        /// Size of the struct.
        pub const SIZE: usize = 24;
        /// `base`.
        pub const BASE: usize = 0;
        /// `length`.
        pub const LENGTH: usize = 8;
        /// `rmStatus`.
        pub const RM_STATUS: usize = 16;
    }

    /// `UVM_REGISTER_GPU_PARAMS`: `{uuid[16]; NvBool numaEnabled; s32 numaNodeId; s32 rmCtrlFd;
    /// u32 hClient; u32 hSmcPartRef; u32 rmStatus}`.
    pub mod register_gpu {
        /// Size of the struct.
        pub const SIZE: usize = 40;
        /// `gpu_uuid`.
        pub const GPU_UUID: usize = 0;
        /// `rmCtrlFd`.
        pub const RM_CTRL_FD: usize = 24;
        /// `hClient`.
        pub const H_CLIENT: usize = 28;
        /// `rmStatus`.
        pub const RM_STATUS: usize = 36;
    }

    /// `UVM_MAP_EXTERNAL_ALLOCATION_PARAMS` with `UVM_MAX_GPUS` = 256 (current drivers; older ones
    /// have 32 entries, so `rmStatus` moves and the fake driver doesn't write it).
    pub mod map_external_allocation {
        /// Size of the struct.
        pub const SIZE: usize = 9264;
        /// `base`.
        pub const BASE: usize = 0;
        /// `length`.
        pub const LENGTH: usize = 8;
        /// `offset`.
        pub const OFFSET: usize = 16;
        /// `gpuAttributesCount`.
        pub const GPU_ATTRIBUTES_COUNT: usize = 9240;
        /// `rmCtrlFd`.
        pub const RM_CTRL_FD: usize = 9248;
        /// `hClient`.
        pub const H_CLIENT: usize = 9252;
        /// `hMemory`.
        pub const H_MEMORY: usize = 9256;
        /// `rmStatus`.
        pub const RM_STATUS: usize = 9260;
    }

    /// Where command `cmd`'s params hold `rmStatus`, when that doesn't depend on the driver.
    #[must_use]
    pub const fn rm_status_offset(cmd: u32) -> Option<usize> {
        Some(match cmd {
            uvm::INITIALIZE => initialize::RM_STATUS,
            // {u64 rangeGroupId; u32 rmStatus}
            uvm::CREATE_RANGE_GROUP => 8,
            // {uuid[16]; s32 rmCtrlFd; u32 hClient; u32 hVaSpace; u32 rmStatus}
            uvm::REGISTER_GPU_VASPACE => 28,
            uvm::CREATE_EXTERNAL_RANGE => range::RM_STATUS,
            uvm::REGISTER_GPU => register_gpu::RM_STATUS,
            // {NvBool pageableMemAccess; u32 rmStatus}, {s32 uvmFd; u32 rmStatus}
            uvm::PAGEABLE_MEM_ACCESS | uvm::MM_INITIALIZE => 4,
            // {u64 base; u64 length; u32 rmStatus}
            uvm::UNSET_PREFERRED_LOCATION => 16,
            // {u64 base; u64 length; uuid[16]; u32 rmStatus}
            uvm::SET_ACCESSED_BY | uvm::UNSET_ACCESSED_BY | uvm::UNMAP_EXTERNAL => 32,
            // `UVM_FREE`, `UVM_MAP_EXTERNAL_ALLOCATION`, `UVM_MIGRATE`,
            // `UVM_SET_PREFERRED_LOCATION`: it moved between versions.
            _ => return None,
        })
    }
}
