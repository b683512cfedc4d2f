//! NVIDIA's ioctl ABI as the test side describes it, independently of the product's table
//! (`gpuwarden_agent_common::nvidia`): the fake driver answers and the synthetic client issues
//! these layouts, so a wrong offset in the product's decoder shows up as a failing test rather
//! than as two copies agreeing with each other.
//!
//! Every value was read from NVIDIA's published headers (open-gpu-kernel-modules 595.45.04,
//! MIT), vendored with their licence under `tests/vendor/open-gpu-kernel-modules`;
//! `tests/tests/abi_headers.rs` compiles `tests/tests/abi/nvidia_layout.c` against them and
//! holds this table and the product's to every `sizeof`, `offsetof` and constant. The UVM
//! command numbers (`nvidia-uvm/uvm_ioctl.h`, not vendored) are checked only by the tests that
//! use them. Offsets are little-endian byte offsets into the parameter structs.

/// `NV_IOCTL_MAGIC` (`nv-ioctl-numbers.h`): the type byte of `_IOWR('F', nr, size)`.
pub const NV_IOCTL_MAGIC: u32 = 0x46;

/// `_IOC_READ | _IOC_WRITE`: the direction bits of every escape.
pub const IOC_READ_WRITE: u32 = 3;

/// `_IOWR(NV_IOCTL_MAGIC, nr, size)`, the command libcuda issues for escape `nr`.
#[must_use]
pub const fn ioctl_cmd(nr: u32, size: u32) -> u32 {
    (IOC_READ_WRITE << 30) | ((size & 0x3fff) << 16) | (NV_IOCTL_MAGIC << 8) | (nr & 0xff)
}

/// `_IOC_NR(cmd)`: the escape, which is all the driver dispatches on besides the size.
#[must_use]
pub const fn ioctl_nr(cmd: u32) -> u32 {
    cmd & 0xff
}

/// `_IOC_SIZE(cmd)`.
#[must_use]
pub const fn ioctl_size(cmd: u32) -> u32 {
    (cmd >> 16) & 0x3fff
}

/// Escape numbers (`NV_ESC_*`, `nv_escape.h` and `nv-ioctl-numbers.h`).
pub mod esc {
    /// `NV_ESC_RM_ALLOC_MEMORY`.
    pub const RM_ALLOC_MEMORY: u32 = 0x27;
    /// `NV_ESC_RM_FREE`.
    pub const RM_FREE: u32 = 0x29;
    /// `NV_ESC_RM_CONTROL`.
    pub const RM_CONTROL: u32 = 0x2a;
    /// `NV_ESC_RM_ALLOC`.
    pub const RM_ALLOC: u32 = 0x2b;
    /// `NV_ESC_RM_DUP_OBJECT`.
    pub const RM_DUP_OBJECT: u32 = 0x34;
    /// `NV_ESC_RM_SHARE`.
    pub const RM_SHARE: u32 = 0x35;
    /// `NV_ESC_RM_I2C_ACCESS`.
    pub const RM_I2C_ACCESS: u32 = 0x39;
    /// `NV_ESC_RM_IDLE_CHANNELS`.
    pub const RM_IDLE_CHANNELS: u32 = 0x41;
    /// `NV_ESC_RM_VID_HEAP_CONTROL`.
    pub const RM_VID_HEAP_CONTROL: u32 = 0x4a;
    /// `NV_ESC_RM_ACCESS_REGISTRY`.
    pub const RM_ACCESS_REGISTRY: u32 = 0x4d;
    /// `NV_ESC_RM_MAP_MEMORY`.
    pub const RM_MAP_MEMORY: u32 = 0x4e;
    /// `NV_ESC_RM_UNMAP_MEMORY`.
    pub const RM_UNMAP_MEMORY: u32 = 0x4f;
    /// `NV_ESC_RM_GET_EVENT_DATA`.
    pub const RM_GET_EVENT_DATA: u32 = 0x52;
    /// `NV_ESC_RM_ALLOC_CONTEXT_DMA2`.
    pub const RM_ALLOC_CONTEXT_DMA2: u32 = 0x54;
    /// `NV_ESC_RM_ADD_VBLANK_CALLBACK`.
    pub const RM_ADD_VBLANK_CALLBACK: u32 = 0x56;
    /// `NV_ESC_RM_MAP_MEMORY_DMA`.
    pub const RM_MAP_MEMORY_DMA: u32 = 0x57;
    /// `NV_ESC_RM_UNMAP_MEMORY_DMA`.
    pub const RM_UNMAP_MEMORY_DMA: u32 = 0x58;
    /// `NV_ESC_RM_BIND_CONTEXT_DMA`.
    pub const RM_BIND_CONTEXT_DMA: u32 = 0x59;
    /// `NV_ESC_RM_EXPORT_OBJECT_TO_FD`.
    pub const RM_EXPORT_OBJECT_TO_FD: u32 = 0x5c;
    /// `NV_ESC_RM_IMPORT_OBJECT_FROM_FD`.
    pub const RM_IMPORT_OBJECT_FROM_FD: u32 = 0x5d;
    /// `NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO`.
    pub const RM_UPDATE_DEVICE_MAPPING_INFO: u32 = 0x5e;
    /// `NV_ESC_CARD_INFO`.
    pub const CARD_INFO: u32 = 0xc8;
    /// `NV_ESC_REGISTER_FD`.
    pub const REGISTER_FD: u32 = 0xc9;
    /// `NV_ESC_ALLOC_OS_EVENT`.
    pub const ALLOC_OS_EVENT: u32 = 0xce;
    /// `NV_ESC_FREE_OS_EVENT`.
    pub const FREE_OS_EVENT: u32 = 0xcf;
    /// `NV_ESC_STATUS_CODE`.
    pub const STATUS_CODE: u32 = 0xd1;
    /// `NV_ESC_CHECK_VERSION_STR`.
    pub const CHECK_VERSION_STR: u32 = 0xd2;
    /// `NV_ESC_IOCTL_XFER_CMD`.
    pub const IOCTL_XFER_CMD: u32 = 0xd3;
    /// `NV_ESC_ATTACH_GPUS_TO_FD`.
    pub const ATTACH_GPUS_TO_FD: u32 = 0xd4;
    /// `NV_ESC_QUERY_DEVICE_INTR`.
    pub const QUERY_DEVICE_INTR: u32 = 0xd5;
    /// `NV_ESC_SYS_PARAMS`.
    pub const SYS_PARAMS: u32 = 0xd6;
    /// `NV_ESC_EXPORT_TO_DMABUF_FD`.
    pub const EXPORT_TO_DMABUF_FD: u32 = 0xd9;
    /// `NV_ESC_WAIT_OPEN_COMPLETE`.
    pub const WAIT_OPEN_COMPLETE: u32 = 0xda;

    /// The escape's name, lowercase without `NV_ESC_` (`rm_alloc`), as the fake driver counts
    /// it; `None` for an escape not listed here.
    #[must_use]
    pub const fn name(nr: u32) -> Option<&'static str> {
        Some(match nr {
            RM_ALLOC_MEMORY => "rm_alloc_memory",
            RM_FREE => "rm_free",
            RM_CONTROL => "rm_control",
            RM_ALLOC => "rm_alloc",
            RM_DUP_OBJECT => "rm_dup_object",
            RM_SHARE => "rm_share",
            RM_I2C_ACCESS => "rm_i2c_access",
            RM_IDLE_CHANNELS => "rm_idle_channels",
            RM_VID_HEAP_CONTROL => "rm_vid_heap_control",
            RM_ACCESS_REGISTRY => "rm_access_registry",
            RM_MAP_MEMORY => "rm_map_memory",
            RM_UNMAP_MEMORY => "rm_unmap_memory",
            RM_GET_EVENT_DATA => "rm_get_event_data",
            RM_ALLOC_CONTEXT_DMA2 => "rm_alloc_context_dma2",
            RM_ADD_VBLANK_CALLBACK => "rm_add_vblank_callback",
            RM_MAP_MEMORY_DMA => "rm_map_memory_dma",
            RM_UNMAP_MEMORY_DMA => "rm_unmap_memory_dma",
            RM_BIND_CONTEXT_DMA => "rm_bind_context_dma",
            RM_EXPORT_OBJECT_TO_FD => "rm_export_object_to_fd",
            RM_IMPORT_OBJECT_FROM_FD => "rm_import_object_from_fd",
            RM_UPDATE_DEVICE_MAPPING_INFO => "rm_update_device_mapping_info",
            CARD_INFO => "card_info",
            REGISTER_FD => "register_fd",
            ALLOC_OS_EVENT => "alloc_os_event",
            FREE_OS_EVENT => "free_os_event",
            STATUS_CODE => "status_code",
            CHECK_VERSION_STR => "check_version_str",
            IOCTL_XFER_CMD => "ioctl_xfer_cmd",
            ATTACH_GPUS_TO_FD => "attach_gpus_to_fd",
            QUERY_DEVICE_INTR => "query_device_intr",
            SYS_PARAMS => "sys_params",
            EXPORT_TO_DMABUF_FD => "export_to_dmabuf_fd",
            WAIT_OPEN_COMPLETE => "wait_open_complete",
            _ => return None,
        })
    }
}

/// `nv_ioctl_xfer_t` (`nv-ioctl.h`): wraps an escape whose params are too large for `_IOC`.
pub mod xfer {
    /// `sizeof(nv_ioctl_xfer_t)`.
    pub const SIZE: u32 = 16;
    /// `cmd` in `nv_ioctl_xfer_t`.
    pub const CMD: usize = 0;
    /// `size` in `nv_ioctl_xfer_t`.
    pub const PARAMS_SIZE: usize = 4;
    /// `ptr` in `nv_ioctl_xfer_t`.
    pub const PTR: usize = 8;
}

/// `NVOS21_PARAMETERS` (`nvos.h`): the short form of `RM_ALLOC`.
pub mod nvos21 {
    /// `sizeof(NVOS21_PARAMETERS)`.
    pub const SIZE: u32 = 32;
    /// `hRoot` in `NVOS21_PARAMETERS`.
    pub const H_ROOT: usize = 0;
    /// `hObjectParent` in `NVOS21_PARAMETERS`.
    pub const H_OBJECT_PARENT: usize = 4;
    /// `hObjectNew` in `NVOS21_PARAMETERS`.
    pub const H_OBJECT_NEW: usize = 8;
    /// `hClass` in `NVOS21_PARAMETERS`.
    pub const H_CLASS: usize = 12;
    /// `pAllocParms` in `NVOS21_PARAMETERS`.
    pub const P_ALLOC_PARMS: usize = 16;
    /// `paramsSize` in `NVOS21_PARAMETERS`.
    pub const PARAMS_SIZE: usize = 24;
    /// `status` in `NVOS21_PARAMETERS`.
    pub const STATUS: usize = 28;
}

/// `NVOS64_PARAMETERS` (`nvos.h`): the long form of `RM_ALLOC`.
pub mod nvos64 {
    /// `sizeof(NVOS64_PARAMETERS)`.
    pub const SIZE: u32 = 48;
    /// `hRoot` in `NVOS64_PARAMETERS`.
    pub const H_ROOT: usize = 0;
    /// `hObjectParent` in `NVOS64_PARAMETERS`.
    pub const H_OBJECT_PARENT: usize = 4;
    /// `hObjectNew` in `NVOS64_PARAMETERS`.
    pub const H_OBJECT_NEW: usize = 8;
    /// `hClass` in `NVOS64_PARAMETERS`.
    pub const H_CLASS: usize = 12;
    /// `pAllocParms` in `NVOS64_PARAMETERS`.
    pub const P_ALLOC_PARMS: usize = 16;
    /// `pRightsRequested` in `NVOS64_PARAMETERS`.
    pub const P_RIGHTS_REQUESTED: usize = 24;
    /// `paramsSize` in `NVOS64_PARAMETERS`.
    pub const PARAMS_SIZE: usize = 32;
    /// `flags` in `NVOS64_PARAMETERS`.
    pub const FLAGS: usize = 36;
    /// `status` in `NVOS64_PARAMETERS`.
    pub const STATUS: usize = 40;
}

/// `NVOS00_PARAMETERS` (`nvos.h`): the params of `RM_FREE`.
pub mod nvos00 {
    /// `sizeof(NVOS00_PARAMETERS)`.
    pub const SIZE: u32 = 16;
    /// `hRoot` in `NVOS00_PARAMETERS`.
    pub const H_ROOT: usize = 0;
    /// `hObjectParent` in `NVOS00_PARAMETERS`.
    pub const H_OBJECT_PARENT: usize = 4;
    /// `hObjectOld` in `NVOS00_PARAMETERS`.
    pub const H_OBJECT_OLD: usize = 8;
    /// `status` in `NVOS00_PARAMETERS`.
    pub const STATUS: usize = 12;
}

/// `NVOS54_PARAMETERS` (`nvos.h`): the params of `RM_CONTROL`.
pub mod nvos54 {
    /// `sizeof(NVOS54_PARAMETERS)`.
    pub const SIZE: u32 = 32;
    /// `hClient` in `NVOS54_PARAMETERS`.
    pub const H_CLIENT: usize = 0;
    /// `hObject` in `NVOS54_PARAMETERS`.
    pub const H_OBJECT: usize = 4;
    /// `cmd` in `NVOS54_PARAMETERS`.
    pub const CMD: usize = 8;
    /// `flags` in `NVOS54_PARAMETERS`.
    pub const FLAGS: usize = 12;
    /// `params` in `NVOS54_PARAMETERS`.
    pub const PARAMS: usize = 16;
    /// `paramsSize` in `NVOS54_PARAMETERS`.
    pub const PARAMS_SIZE: usize = 24;
    /// `status` in `NVOS54_PARAMETERS`.
    pub const STATUS: usize = 28;
}

/// `nv_ioctl_nvos02_parameters_with_fd` (`nv-unix-nvos-params-wrappers.h`): `NVOS02_PARAMETERS` then an fd; the params of `RM_ALLOC_MEMORY`.
pub mod nvos02 {
    /// `sizeof(nv_ioctl_nvos02_parameters_with_fd)`.
    pub const SIZE: u32 = 56;
    /// `params.hRoot` in `nv_ioctl_nvos02_parameters_with_fd`.
    pub const H_ROOT: usize = 0;
    /// `params.hObjectParent` in `nv_ioctl_nvos02_parameters_with_fd`.
    pub const H_OBJECT_PARENT: usize = 4;
    /// `params.hObjectNew` in `nv_ioctl_nvos02_parameters_with_fd`.
    pub const H_OBJECT_NEW: usize = 8;
    /// `params.hClass` in `nv_ioctl_nvos02_parameters_with_fd`.
    pub const H_CLASS: usize = 12;
    /// `params.flags` in `nv_ioctl_nvos02_parameters_with_fd`.
    pub const FLAGS: usize = 16;
    /// `params.pMemory` in `nv_ioctl_nvos02_parameters_with_fd`.
    pub const P_MEMORY: usize = 24;
    /// `params.limit` in `nv_ioctl_nvos02_parameters_with_fd`.
    pub const LIMIT: usize = 32;
    /// `params.status` in `nv_ioctl_nvos02_parameters_with_fd`.
    pub const STATUS: usize = 40;
    /// `fd` in `nv_ioctl_nvos02_parameters_with_fd`.
    pub const FD: usize = 48;
    /// `DRF_SHIFT(NVOS02_FLAGS_LOCATION)`.
    pub const FLAGS_LOCATION_SHIFT: u32 = 8;
    /// `DRF_MASK(NVOS02_FLAGS_LOCATION)`.
    pub const FLAGS_LOCATION_MASK: u32 = 15;
    /// `NVOS02_FLAGS_LOCATION_PCI`.
    pub const LOCATION_PCI: u32 = 0;
    /// `NVOS02_FLAGS_LOCATION_VIDMEM`.
    pub const LOCATION_VIDMEM: u32 = 2;
    /// `DRF_SHIFT(NVOS02_FLAGS_ALLOC)`.
    pub const FLAGS_ALLOC_SHIFT: u32 = 16;
    /// `NVOS02_FLAGS_ALLOC_NONE`.
    pub const ALLOC_NONE: u32 = 1;
    /// `DRF_SHIFT(NVOS02_FLAGS_MAPPING)`.
    pub const FLAGS_MAPPING_SHIFT: u32 = 30;
    /// `NVOS02_FLAGS_MAPPING_NO_MAP`.
    pub const MAPPING_NO_MAP: u32 = 1;
}

/// `NVOS32_PARAMETERS` (`nvos.h`): the params of `RM_VID_HEAP_CONTROL`, a head then a union by `function`.
pub mod nvos32 {
    /// `sizeof(NVOS32_PARAMETERS)`.
    pub const SIZE: u32 = 184;
    /// `hRoot` in `NVOS32_PARAMETERS`.
    pub const H_ROOT: usize = 0;
    /// `hObjectParent` in `NVOS32_PARAMETERS`.
    pub const H_OBJECT_PARENT: usize = 4;
    /// `function` in `NVOS32_PARAMETERS`.
    pub const FUNCTION: usize = 8;
    /// `status` in `NVOS32_PARAMETERS`.
    pub const STATUS: usize = 20;
    /// `data.AllocSize.owner` in `NVOS32_PARAMETERS`.
    pub const ALLOC_OWNER: usize = 40;
    /// `data.AllocSize.hMemory` in `NVOS32_PARAMETERS`.
    pub const H_MEMORY: usize = 44;
    /// `data.Free.hMemory` in `NVOS32_PARAMETERS`.
    pub const FREE_H_MEMORY: usize = 44;
    /// `data.AllocSize.type` in `NVOS32_PARAMETERS`.
    pub const ALLOC_TYPE: usize = 48;
    /// `data.AllocSize.flags` in `NVOS32_PARAMETERS`.
    pub const ALLOC_FLAGS: usize = 52;
    /// `data.AllocSize.attr` in `NVOS32_PARAMETERS`.
    pub const ALLOC_ATTR: usize = 56;
    /// `data.AllocSize.size` in `NVOS32_PARAMETERS`.
    pub const ALLOC_SIZE: usize = 88;
    /// `NVOS32_FUNCTION_ALLOC_SIZE`.
    pub const FUNCTION_ALLOC_SIZE: u32 = 2;
    /// `NVOS32_FUNCTION_FREE`.
    pub const FUNCTION_FREE: u32 = 3;
    /// `NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED`.
    pub const FLAGS_MEMORY_HANDLE_PROVIDED: u32 = 0x4000;
    /// `NVOS32_ALLOC_FLAGS_VIRTUAL`.
    pub const FLAGS_VIRTUAL: u32 = 0x80000;
    /// `DRF_SHIFT(NVOS32_ATTR_LOCATION)`.
    pub const ATTR_LOCATION_SHIFT: u32 = 25;
    /// `DRF_MASK(NVOS32_ATTR_LOCATION)`.
    pub const ATTR_LOCATION_MASK: u32 = 3;
    /// `NVOS32_ATTR_LOCATION_VIDMEM`.
    pub const LOCATION_VIDMEM: u32 = 0;
    /// `NVOS32_ATTR_LOCATION_PCI`.
    pub const LOCATION_PCI: u32 = 1;
    /// `NVOS32_ATTR_LOCATION_ANY`.
    pub const LOCATION_ANY: u32 = 3;
}

/// `NV_MEMORY_ALLOCATION_PARAMS` (`nvos.h`): the params of the memory classes.
pub mod memory_alloc {
    /// `sizeof(NV_MEMORY_ALLOCATION_PARAMS)`.
    pub const SIZE: u32 = 128;
    /// `offsetof(NV_MEMORY_ALLOCATION_PARAMS, numaNode)`.
    pub const SIZE_OLD: u32 = 120;
    /// `owner` in `NV_MEMORY_ALLOCATION_PARAMS`.
    pub const OWNER: usize = 0;
    /// `type` in `NV_MEMORY_ALLOCATION_PARAMS`.
    pub const TYPE: usize = 4;
    /// `flags` in `NV_MEMORY_ALLOCATION_PARAMS`.
    pub const FLAGS: usize = 8;
    /// `attr` in `NV_MEMORY_ALLOCATION_PARAMS`.
    pub const ATTR: usize = 24;
    /// `size` in `NV_MEMORY_ALLOCATION_PARAMS`.
    pub const SIZE_FIELD: usize = 64;
    /// `hVASpace` in `NV_MEMORY_ALLOCATION_PARAMS`.
    pub const H_VA_SPACE: usize = 0x6c;
    /// `NVOS32_ALLOC_FLAGS_VIRTUAL`.
    pub const FLAGS_VIRTUAL: u32 = 0x80000;
    /// `DRF_SHIFT(NVOS32_ATTR_LOCATION)`.
    pub const ATTR_LOCATION_SHIFT: u32 = 25;
    /// `DRF_MASK(NVOS32_ATTR_LOCATION)`.
    pub const ATTR_LOCATION_MASK: u32 = 3;
    /// `NVOS32_ATTR_LOCATION_VIDMEM`.
    pub const ATTR_LOCATION_VIDMEM: u32 = 0;
    /// `NVOS32_ATTR_LOCATION_PCI`.
    pub const ATTR_LOCATION_PCI: u32 = 1;
}

/// `NV0080_ALLOC_PARAMETERS` (`class/cl0080.h`).
pub mod device_alloc {
    /// `deviceId` in `NV0080_ALLOC_PARAMETERS`.
    pub const DEVICE_ID: usize = 0;
}

/// `NV2080_ALLOC_PARAMETERS` (`class/cl2080.h`).
pub mod subdevice_alloc {
    /// `subDeviceId` in `NV2080_ALLOC_PARAMETERS`.
    pub const SUBDEVICE_ID: usize = 0;
}

/// `NVC637_ALLOCATION_PARAMETERS` (`class/clc637.h`): a client's subscription to a MIG GPU
/// instance, under its subdevice.
pub mod smc_partition {
    /// `sizeof`.
    pub const SIZE: u32 = 16;
    /// `capDescriptor` (`NvU64`, 8-aligned): an fd of the instance's capability node.
    pub const CAP_DESCRIPTOR: usize = 0;
    /// `swizzId` (`NvU32`): the GPU instance id.
    pub const SWIZZ_ID: usize = 8;
    /// `NVC637_DEVICE_PROFILING_SWIZZID`.
    pub const DEVICE_PROFILING_SWIZZID: u32 = 0xffff_fffe;
}

/// `NVC638_ALLOCATION_PARAMETERS` (`class/clc638.h`): a subscription to a compute instance,
/// under an `AMPERE_SMC_PARTITION_REF`.
pub mod smc_exec_partition {
    /// `sizeof`.
    pub const SIZE: u32 = 16;
    /// `capDescriptor` (`NvU64`).
    pub const CAP_DESCRIPTOR: usize = 0;
    /// `execPartitionId` (`NvU32`): the compute instance id.
    pub const EXEC_PARTITION_ID: usize = 8;
}

/// Object classes (`hClass`), from `nvos.h` and `class/cl*.h`.
pub mod class {
    /// `NV01_ROOT`.
    pub const ROOT: u32 = 0x0;
    /// `NV01_ROOT_NON_PRIV`.
    pub const ROOT_NON_PRIV: u32 = 0x1;
    /// `NV01_ROOT_CLIENT`.
    pub const ROOT_CLIENT: u32 = 0x41;
    /// `NV01_MEMORY_SYSTEM`.
    pub const MEMORY_SYSTEM: u32 = 0x3e;
    /// `NV01_MEMORY_LOCAL_USER`.
    pub const MEMORY_LOCAL_USER: u32 = 0x40;
    /// `NV01_MEMORY_VIRTUAL`.
    pub const MEMORY_VIRTUAL: u32 = 0x70;
    /// `NV01_MEMORY_SYSTEM_OS_DESCRIPTOR`.
    pub const MEMORY_SYSTEM_OS_DESCRIPTOR: u32 = 0x71;
    /// `NV01_DEVICE_0`.
    pub const DEVICE_0: u32 = 0x80;
    /// `NV20_SUBDEVICE_0`.
    pub const SUBDEVICE_0: u32 = 0x2080;
    /// `NV50_MEMORY_VIRTUAL`.
    pub const NV50_MEMORY_VIRTUAL: u32 = 0x50a0;
    /// `AMPERE_SMC_PARTITION_REF` (`class/clc637.h`).
    pub const SMC_PARTITION_REF: u32 = 0xc637;
    /// `AMPERE_SMC_EXEC_PARTITION_REF` (`class/clc638.h`).
    pub const SMC_EXEC_PARTITION_REF: u32 = 0xc638;

    /// Whether `class` makes a client (`NV01_ROOT`, `NV01_ROOT_NON_PRIV`, `NV01_ROOT_CLIENT`).
    #[must_use]
    pub const fn is_client(class: u32) -> bool {
        matches!(class, ROOT | ROOT_NON_PRIV | ROOT_CLIENT)
    }
}

/// `NV_STATUS` codes (`nvstatuscodes.h`).
pub mod status {
    /// `NV_OK`.
    pub const OK: u32 = 0x0;
    /// `NV_ERR_NO_MEMORY`.
    pub const NO_MEMORY: u32 = 0x51;
    /// `NV_ERR_INSUFFICIENT_RESOURCES`.
    pub const INSUFFICIENT_RESOURCES: u32 = 0x1a;
    /// `NV_ERR_INVALID_ARGUMENT`.
    pub const INVALID_ARGUMENT: u32 = 0x1f;
    /// `NV_ERR_INSERT_DUPLICATE_NAME`.
    pub const INSERT_DUPLICATE_NAME: u32 = 0x19;
    /// `NV_ERR_INVALID_CLIENT`.
    pub const INVALID_CLIENT: u32 = 0x23;
    /// `NV_ERR_INVALID_OBJECT_HANDLE`.
    pub const INVALID_OBJECT_HANDLE: u32 = 0x33;
    /// `NV_ERR_INVALID_OBJECT_PARENT`.
    pub const INVALID_OBJECT_PARENT: u32 = 0x36;
    /// `NV_ERR_INVALID_CLASS`.
    pub const INVALID_CLASS: u32 = 0x22;
    /// `NV_ERR_INVALID_FLAGS`.
    pub const INVALID_FLAGS: u32 = 0x29;
    /// `NV_ERR_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: u32 = 0x56;
    /// `NV_ERR_INSUFFICIENT_PERMISSIONS`.
    pub const INSUFFICIENT_PERMISSIONS: u32 = 0x1b;
    /// `NV_ERR_INVALID_STATE`.
    pub const INVALID_STATE: u32 = 0x40;
}

/// `/dev/nvidia-uvm` commands (`nvidia-uvm/uvm_ioctl.h`, `uvm_linux_ioctl.h`): plain numbers,
/// not `_IOC`-encoded.
pub mod uvm {
    /// `UVM_INITIALIZE`.
    pub const INITIALIZE: u32 = 0x3000_0001;
    /// `UVM_DEINITIALIZE`.
    pub const DEINITIALIZE: u32 = 0x3000_0002;
    /// `UVM_CREATE_RANGE_GROUP`.
    pub const CREATE_RANGE_GROUP: u32 = 23;
    /// `UVM_REGISTER_GPU_VASPACE`.
    pub const REGISTER_GPU_VASPACE: u32 = 25;
    /// `UVM_MAP_EXTERNAL_ALLOCATION`.
    pub const MAP_EXTERNAL_ALLOCATION: u32 = 33;
    /// `UVM_FREE`.
    pub const FREE: u32 = 34;
    /// `UVM_REGISTER_GPU`.
    pub const REGISTER_GPU: u32 = 37;
    /// `UVM_PAGEABLE_MEM_ACCESS`.
    pub const PAGEABLE_MEM_ACCESS: u32 = 39;
    /// `UVM_SET_PREFERRED_LOCATION`.
    pub const SET_PREFERRED_LOCATION: u32 = 42;
    /// `UVM_UNSET_PREFERRED_LOCATION`.
    pub const UNSET_PREFERRED_LOCATION: u32 = 43;
    /// `UVM_SET_ACCESSED_BY`.
    pub const SET_ACCESSED_BY: u32 = 46;
    /// `UVM_UNSET_ACCESSED_BY`.
    pub const UNSET_ACCESSED_BY: u32 = 47;
    /// `UVM_MIGRATE`.
    pub const MIGRATE: u32 = 51;
    /// `UVM_UNMAP_EXTERNAL`.
    pub const UNMAP_EXTERNAL: u32 = 66;
    /// `UVM_CREATE_EXTERNAL_RANGE`.
    pub const CREATE_EXTERNAL_RANGE: u32 = 73;
    /// `UVM_MM_INITIALIZE`.
    pub const MM_INITIALIZE: u32 = 75;

    /// The command's name, lowercase with `uvm_` (`uvm_initialize`), as the fake driver counts
    /// it; `None` for a command not listed here.
    #[must_use]
    pub const fn name(cmd: u32) -> Option<&'static str> {
        Some(match cmd {
            INITIALIZE => "uvm_initialize",
            DEINITIALIZE => "uvm_deinitialize",
            CREATE_RANGE_GROUP => "uvm_create_range_group",
            REGISTER_GPU_VASPACE => "uvm_register_gpu_vaspace",
            MAP_EXTERNAL_ALLOCATION => "uvm_map_external_allocation",
            FREE => "uvm_free",
            REGISTER_GPU => "uvm_register_gpu",
            PAGEABLE_MEM_ACCESS => "uvm_pageable_mem_access",
            SET_PREFERRED_LOCATION => "uvm_set_preferred_location",
            UNSET_PREFERRED_LOCATION => "uvm_unset_preferred_location",
            SET_ACCESSED_BY => "uvm_set_accessed_by",
            UNSET_ACCESSED_BY => "uvm_unset_accessed_by",
            MIGRATE => "uvm_migrate",
            UNMAP_EXTERNAL => "uvm_unmap_external",
            CREATE_EXTERNAL_RANGE => "uvm_create_external_range",
            MM_INITIALIZE => "uvm_mm_initialize",
            _ => return None,
        })
    }
}
