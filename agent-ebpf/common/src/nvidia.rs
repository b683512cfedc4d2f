//! The NVIDIA driver's ioctl ABI, as far as gpuwarden decodes it.
//!
//! Sources: NVIDIA's open-gpu-kernel-modules (`nv-ioctl-numbers.h`, `nvos.h`, `class/cl*.h`,
//! `nvidia-uvm/uvm_ioctl.h`). Offsets are little-endian byte offsets into the parameter structs.

/// Escapes on `/dev/nvidiactl` and `/dev/nvidiaN` are `_IOWR('F', nr, size)`; the driver
/// dispatches on `nr` and `size` alone.
pub const NV_IOCTL_MAGIC: u32 = b'F' as u32;

/// `_IOC` direction bits for read + write.
pub const IOC_READ_WRITE: u32 = 3;

/// Builds the full ioctl command for escape `nr` with a parameter struct of `size` bytes.
#[must_use]
pub const fn ioctl_cmd(nr: u32, size: u32) -> u32 {
    (IOC_READ_WRITE << 30) | ((size & 0x3fff) << 16) | (NV_IOCTL_MAGIC << 8) | (nr & 0xff)
}

/// The escape number of an `_IOC`-encoded command.
#[must_use]
pub const fn ioctl_nr(cmd: u32) -> u32 {
    cmd & 0xff
}

/// The parameter size of an `_IOC`-encoded command.
#[must_use]
pub const fn ioctl_size(cmd: u32) -> u32 {
    (cmd >> 16) & 0x3fff
}

/// Whether the NVIDIA driver may act on an ioctl with command `cmd` on any of the nodes gpuwarden
/// watches: the cheap test `ioctl` enter makes before it looks at the fd's file, so most other
/// drivers' ioctls (a terminal's `TCGETS`, `FIONREAD`, a socket's `SIOC*`) cost nothing more.
///
/// It must never say no to a command the driver acts on: the RM nodes dispatch on the escape
/// number alone (the type byte and direction are ignored, the size is checked per escape), so
/// every command whose number lies in the escapes' ranges passes, with room for escapes added
/// later — `NV_ESC_RM_*` from 0x27 to 0x5f (0x20–0x7f passes), `NV_ESC_*` from 200 (0xc8–0xff
/// passes), and number 0 (`nvidia-modeset`'s one command, counted as today); the UVM nodes
/// match the whole command, a plain number below 0x100 or `UVM_INITIALIZE`/`UVM_DEINITIALIZE`.
#[must_use]
pub const fn may_be_driver_ioctl(cmd: u32) -> bool {
    if cmd < 0x100 || cmd >> 8 == uvm::INITIALIZE >> 8 {
        return true;
    }
    let nr = ioctl_nr(cmd);
    nr == 0 || (nr >= 0x20 && nr <= 0x7f) || nr >= 0xc8
}

/// Resource-manager escape numbers (`NV_ESC_*`).
pub mod esc {
    /// `NV_ESC_RM_ALLOC_MEMORY` (`nvos02_with_fd`, 56 bytes).
    pub const RM_ALLOC_MEMORY: u32 = 0x27;
    /// `NV_ESC_RM_FREE` (NVOS00, 16 bytes).
    pub const RM_FREE: u32 = 0x29;
    /// `NV_ESC_RM_CONTROL` (NVOS54, 32 bytes).
    pub const RM_CONTROL: u32 = 0x2a;
    /// `NV_ESC_RM_ALLOC` (NVOS21, 32 bytes, or NVOS64, 48 bytes).
    pub const RM_ALLOC: u32 = 0x2b;
    /// `NV_ESC_RM_DUP_OBJECT`.
    pub const RM_DUP_OBJECT: u32 = 0x34;
    /// `NV_ESC_RM_SHARE`.
    pub const RM_SHARE: u32 = 0x35;
    /// `NV_ESC_RM_I2C_ACCESS`.
    pub const RM_I2C_ACCESS: u32 = 0x39;
    /// `NV_ESC_RM_IDLE_CHANNELS`.
    pub const RM_IDLE_CHANNELS: u32 = 0x41;
    /// `NV_ESC_RM_VID_HEAP_CONTROL` (NVOS32).
    pub const RM_VID_HEAP_CONTROL: u32 = 0x4a;
    /// `NV_ESC_RM_ACCESS_REGISTRY`.
    pub const RM_ACCESS_REGISTRY: u32 = 0x4d;
    /// `NV_ESC_RM_MAP_MEMORY` (`nvos33_with_fd`, 56 bytes).
    pub const RM_MAP_MEMORY: u32 = 0x4e;
    /// `NV_ESC_RM_UNMAP_MEMORY` (NVOS34, 32 bytes).
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
    /// `NV_ESC_CARD_INFO` (72 bytes per card).
    pub const CARD_INFO: u32 = 0xc8;
    /// `NV_ESC_REGISTER_FD` (4 bytes: the control fd).
    pub const REGISTER_FD: u32 = 0xc9;
    /// `NV_ESC_ALLOC_OS_EVENT`.
    pub const ALLOC_OS_EVENT: u32 = 0xce;
    /// `NV_ESC_FREE_OS_EVENT`.
    pub const FREE_OS_EVENT: u32 = 0xcf;
    /// `NV_ESC_STATUS_CODE`.
    pub const STATUS_CODE: u32 = 0xd1;
    /// `NV_ESC_CHECK_VERSION_STR` (72 bytes).
    pub const CHECK_VERSION_STR: u32 = 0xd2;
    /// `NV_ESC_IOCTL_XFER_CMD` (16 bytes): wraps another escape with larger params.
    pub const IOCTL_XFER_CMD: u32 = 0xd3;
    /// `NV_ESC_ATTACH_GPUS_TO_FD` (u32 per GPU).
    pub const ATTACH_GPUS_TO_FD: u32 = 0xd4;
    /// `NV_ESC_QUERY_DEVICE_INTR`.
    pub const QUERY_DEVICE_INTR: u32 = 0xd5;
    /// `NV_ESC_SYS_PARAMS`.
    pub const SYS_PARAMS: u32 = 0xd6;
    /// `NV_ESC_EXPORT_TO_DMABUF_FD` (`NV_IOCTL_BASE + 17`; 0xd7 was wrong).
    pub const EXPORT_TO_DMABUF_FD: u32 = 0xd9;
    /// `NV_ESC_WAIT_OPEN_COMPLETE` (`NV_IOCTL_BASE + 18`; 0xd8 was wrong).
    pub const WAIT_OPEN_COMPLETE: u32 = 0xda;

    /// A stable lowercase name for an escape, or `None` when gpuwarden doesn't name it.
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

/// `nv_ioctl_xfer_t` (16 bytes): `{u32 cmd; u32 size; u64 ptr}`.
pub mod xfer {
    /// Size of the struct.
    pub const SIZE: u32 = 16;
    /// Offset of the inner escape number.
    pub const CMD: usize = 0;
    /// Offset of the inner parameter size.
    pub const PARAMS_SIZE: usize = 4;
    /// Offset of the pointer to the inner parameters.
    pub const PTR: usize = 8;
}

/// `NVOS21_PARAMETERS` (32 bytes), the short form of `RM_ALLOC`.
pub mod nvos21 {
    /// Size of the struct.
    pub const SIZE: u32 = 32;
    /// `hRoot` (the client).
    pub const H_ROOT: usize = 0;
    /// `hObjectParent`.
    pub const H_OBJECT_PARENT: usize = 4;
    /// `hObjectNew` (in/out).
    pub const H_OBJECT_NEW: usize = 8;
    /// `hClass`.
    pub const H_CLASS: usize = 12;
    /// `pAllocParms` (user pointer).
    pub const P_ALLOC_PARMS: usize = 16;
    /// `paramsSize`.
    pub const PARAMS_SIZE: usize = 24;
    /// `status` (out).
    pub const STATUS: usize = 28;
}

/// `NVOS64_PARAMETERS` (48 bytes), the long form of `RM_ALLOC`.
pub mod nvos64 {
    /// Size of the struct.
    pub const SIZE: u32 = 48;
    /// `hRoot` (the client).
    pub const H_ROOT: usize = 0;
    /// `hObjectParent`.
    pub const H_OBJECT_PARENT: usize = 4;
    /// `hObjectNew` (in/out).
    pub const H_OBJECT_NEW: usize = 8;
    /// `hClass`.
    pub const H_CLASS: usize = 12;
    /// `pAllocParms` (user pointer).
    pub const P_ALLOC_PARMS: usize = 16;
    /// `pRightsRequested` (user pointer).
    pub const P_RIGHTS_REQUESTED: usize = 24;
    /// `paramsSize`.
    pub const PARAMS_SIZE: usize = 32;
    /// `flags`.
    pub const FLAGS: usize = 36;
    /// `status` (out).
    pub const STATUS: usize = 40;
}

/// `NVOS00_PARAMETERS` (16 bytes), the params of `RM_FREE`.
pub mod nvos00 {
    /// Size of the struct.
    pub const SIZE: u32 = 16;
    /// `hRoot` (the client).
    pub const H_ROOT: usize = 0;
    /// `hObjectParent`.
    pub const H_OBJECT_PARENT: usize = 4;
    /// `hObjectOld` (the object to free; the client itself when equal to `hRoot`).
    pub const H_OBJECT_OLD: usize = 8;
    /// `status` (out).
    pub const STATUS: usize = 12;
}

/// `NVOS54_PARAMETERS` (32 bytes), the params of `RM_CONTROL`.
pub mod nvos54 {
    /// Size of the struct.
    pub const SIZE: u32 = 32;
    /// `hClient`.
    pub const H_CLIENT: usize = 0;
    /// `hObject`.
    pub const H_OBJECT: usize = 4;
    /// `cmd` (the control command).
    pub const CMD: usize = 8;
    /// `flags`.
    pub const FLAGS: usize = 12;
    /// `params` (user pointer).
    pub const PARAMS: usize = 16;
    /// `paramsSize`.
    pub const PARAMS_SIZE: usize = 24;
    /// `status` (out).
    pub const STATUS: usize = 28;
}

/// `nv_ioctl_nvos02_parameters_with_fd` (56 bytes), the params of `RM_ALLOC_MEMORY`:
/// `NVOS02_PARAMETERS` then the fd to map through. Issued on a GPU node (`nvidiaN`).
pub mod nvos02 {
    /// Size of the struct with its fd.
    pub const SIZE: u32 = 56;
    /// `hRoot` (the client).
    pub const H_ROOT: usize = 0;
    /// `hObjectParent`.
    pub const H_OBJECT_PARENT: usize = 4;
    /// `hObjectNew` (the handle the caller chose).
    pub const H_OBJECT_NEW: usize = 8;
    /// `hClass`.
    pub const H_CLASS: usize = 12;
    /// `flags` (`NVOS02_FLAGS_*`).
    pub const FLAGS: usize = 16;
    /// `pMemory` (in: the user memory an OS descriptor wraps; out: a CPU mapping).
    pub const P_MEMORY: usize = 24;
    /// `limit`: the size minus one.
    pub const LIMIT: usize = 32;
    /// `status` (out).
    pub const STATUS: usize = 40;
    /// `fd`.
    pub const FD: usize = 48;
    /// Shift of `NVOS02_FLAGS_LOCATION` (bits 11:8).
    pub const FLAGS_LOCATION_SHIFT: u32 = 8;
    /// Mask of the location after the shift.
    pub const FLAGS_LOCATION_MASK: u32 = 0xf;
    /// `NVOS02_FLAGS_LOCATION_PCI`: host memory.
    pub const LOCATION_PCI: u32 = 0;
    /// `NVOS02_FLAGS_LOCATION_VIDMEM`.
    pub const LOCATION_VIDMEM: u32 = 2;
    /// Shift of `NVOS02_FLAGS_ALLOC` (bits 17:16).
    pub const FLAGS_ALLOC_SHIFT: u32 = 16;
    /// `NVOS02_FLAGS_ALLOC_NONE`: no memory behind the object.
    pub const ALLOC_NONE: u32 = 1;
    /// Shift of `NVOS02_FLAGS_MAPPING` (bits 31:30).
    pub const FLAGS_MAPPING_SHIFT: u32 = 30;
    /// `NVOS02_FLAGS_MAPPING_NO_MAP`.
    pub const MAPPING_NO_MAP: u32 = 1;
}

/// `NVOS32_PARAMETERS` (184 bytes), the params of `RM_VID_HEAP_CONTROL` (on `nvidiactl`): a
/// head, then a union by `function`. Only `ALLOC_SIZE` and `FREE` are decoded.
pub mod nvos32 {
    /// Size of the struct.
    pub const SIZE: u32 = 184;
    /// `hRoot` (the client).
    pub const H_ROOT: usize = 0;
    /// `hObjectParent` (a device).
    pub const H_OBJECT_PARENT: usize = 4;
    /// `function` (`NVOS32_FUNCTION_*`).
    pub const FUNCTION: usize = 8;
    /// `status` (out).
    pub const STATUS: usize = 20;
    /// `data.AllocSize.owner`.
    pub const ALLOC_OWNER: usize = 40;
    /// `data.AllocSize.hMemory` (in/out), also `data.Free.hMemory`.
    pub const H_MEMORY: usize = 44;
    /// `data.AllocSize.type`.
    pub const ALLOC_TYPE: usize = 48;
    /// `data.AllocSize.flags` (`NVOS32_ALLOC_FLAGS_*`).
    pub const ALLOC_FLAGS: usize = 52;
    /// `data.AllocSize.attr` (`NVOS32_ATTR_*`).
    pub const ALLOC_ATTR: usize = 56;
    /// `data.AllocSize.size` (in/out: the driver writes back the size it allocated).
    pub const ALLOC_SIZE: usize = 88;
    /// `NVOS32_FUNCTION_ALLOC_SIZE`.
    pub const FUNCTION_ALLOC_SIZE: u32 = 2;
    /// `NVOS32_FUNCTION_FREE`.
    pub const FUNCTION_FREE: u32 = 3;
    /// `NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED`: `hMemory` is the caller's choice.
    pub const FLAGS_MEMORY_HANDLE_PROVIDED: u32 = 0x0000_4000;
    /// `NVOS32_ALLOC_FLAGS_VIRTUAL`: address space only.
    pub const FLAGS_VIRTUAL: u32 = 0x0008_0000;
    /// Shift of `NVOS32_ATTR_LOCATION` (bits 26:25).
    pub const ATTR_LOCATION_SHIFT: u32 = 25;
    /// Mask of the location after the shift.
    pub const ATTR_LOCATION_MASK: u32 = 0x3;
    /// `NVOS32_ATTR_LOCATION_VIDMEM`.
    pub const LOCATION_VIDMEM: u32 = 0;
    /// `NVOS32_ATTR_LOCATION_PCI`: host memory.
    pub const LOCATION_PCI: u32 = 1;
    /// `NVOS32_ATTR_LOCATION_ANY`: the driver's choice.
    pub const LOCATION_ANY: u32 = 3;
}

/// `NV_MEMORY_ALLOCATION_PARAMS`: 120 bytes before driver 545.23.06, 128 since.
pub mod memory_alloc {
    /// Size before driver 545.23.06.
    pub const SIZE_OLD: u32 = 120;
    /// Size since driver 545.23.06 (adds `numaNode`).
    pub const SIZE: u32 = 128;
    /// `owner`.
    pub const OWNER: usize = 0;
    /// `type`.
    pub const TYPE: usize = 4;
    /// `flags`.
    pub const FLAGS: usize = 8;
    /// `attr`: bits 25–26 are the location (0 = video memory).
    pub const ATTR: usize = 24;
    /// `size` (in/out: the driver writes back the size it allocated).
    pub const SIZE_FIELD: usize = 64;
    /// `hVASpace`.
    pub const H_VA_SPACE: usize = 108;
    /// `flags` bit: a virtual-address reservation only, no backing memory.
    pub const FLAGS_VIRTUAL: u32 = 0x0008_0000;
    /// Shift of the location field in `attr`.
    pub const ATTR_LOCATION_SHIFT: u32 = 25;
    /// Mask of the location field in `attr` (after the shift).
    pub const ATTR_LOCATION_MASK: u32 = 0x3;
    /// Location value for video memory (`NVOS32_ATTR_LOCATION_VIDMEM`).
    pub const ATTR_LOCATION_VIDMEM: u32 = 0;
    /// Location value for host memory (`NVOS32_ATTR_LOCATION_PCI`).
    pub const ATTR_LOCATION_PCI: u32 = 1;
}

/// `NV0080_ALLOC_PARAMETERS`: the params of an `NV01_DEVICE_0` allocation.
pub mod device_alloc {
    /// `deviceId` (the device instance).
    pub const DEVICE_ID: usize = 0;
}

/// `NV2080_ALLOC_PARAMETERS`: the params of an `NV20_SUBDEVICE_0` allocation.
pub mod subdevice_alloc {
    /// `subDeviceId`.
    pub const SUBDEVICE_ID: usize = 0;
}

/// `NVC637_ALLOCATION_PARAMETERS` (`class/clc637.h`): subscribing a client to a MIG GPU
/// instance, under its subdevice.
pub mod smc_partition {
    /// Size of the params.
    pub const SIZE: u32 = 16;
    /// `capDescriptor` (u64): the fd of the instance's capability node, filled by the user-mode
    /// shim.
    pub const CAP_DESCRIPTOR: usize = 0;
    /// `swizzId`: the GPU instance id.
    pub const SWIZZ_ID: usize = 8;
    /// `NVC637_DEVICE_PROFILING_SWIZZID`: device-level profiling, no instance.
    pub const DEVICE_PROFILING_SWIZZID: u32 = 0xffff_fffe;
}

/// `NVC638_ALLOCATION_PARAMETERS` (`class/clc638.h`): subscribing to a compute instance, under
/// an `AMPERE_SMC_PARTITION_REF`.
pub mod smc_exec_partition {
    /// Size of the params.
    pub const SIZE: u32 = 16;
    /// `capDescriptor` (u64).
    pub const CAP_DESCRIPTOR: usize = 0;
    /// `execPartitionId`: the compute instance id.
    pub const EXEC_PARTITION_ID: usize = 8;
}

/// Object classes (`hClass` of `RM_ALLOC`).
pub mod class {
    /// `NV01_MEMORY_SYSTEM`: host memory mapped for the GPU.
    pub const MEMORY_SYSTEM: u32 = 0x3e;
    /// `NV01_MEMORY_LOCAL_USER`: video memory.
    pub const MEMORY_LOCAL_USER: u32 = 0x40;
    /// `NV01_ROOT` / `NV01_ROOT_CLIENT`: a client (`hRoot` of everything after).
    pub const ROOT: u32 = 0x0;
    /// `NV01_ROOT_NON_PRIV`.
    pub const ROOT_NON_PRIV: u32 = 0x1;
    /// `NV01_ROOT_CLIENT`.
    pub const ROOT_CLIENT: u32 = 0x41;
    /// `NV01_MEMORY_VIRTUAL`: a virtual-address range, no backing memory.
    pub const MEMORY_VIRTUAL: u32 = 0x70;
    /// `NV01_MEMORY_SYSTEM_OS_DESCRIPTOR`: user memory pinned for the GPU.
    pub const MEMORY_SYSTEM_OS_DESCRIPTOR: u32 = 0x71;
    /// `NV01_DEVICE_0`.
    pub const DEVICE_0: u32 = 0x80;
    /// `NV20_SUBDEVICE_0`.
    pub const SUBDEVICE_0: u32 = 0x2080;
    /// `NV50_MEMORY_VIRTUAL`: a virtual-address reservation when its flags say so.
    pub const NV50_MEMORY_VIRTUAL: u32 = 0x50a0;
    /// `AMPERE_SMC_PARTITION_REF`: a client's subscription to a MIG GPU instance.
    pub const SMC_PARTITION_REF: u32 = 0xc637;
    /// `AMPERE_SMC_EXEC_PARTITION_REF`: its subscription to a compute instance in it.
    pub const SMC_EXEC_PARTITION_REF: u32 = 0xc638;

    /// Whether `class` creates a client.
    #[must_use]
    pub const fn is_client(class: u32) -> bool {
        matches!(class, ROOT | ROOT_NON_PRIV | ROOT_CLIENT)
    }
}

/// RM status codes.
pub mod status {
    /// `NV_OK`.
    pub const OK: u32 = 0;
    /// `NV_ERR_NO_MEMORY`.
    pub const NO_MEMORY: u32 = 0x51;
    /// `NV_ERR_INSUFFICIENT_RESOURCES`.
    pub const INSUFFICIENT_RESOURCES: u32 = 0x1a;
    /// `NV_ERR_INVALID_ARGUMENT`.
    pub const INVALID_ARGUMENT: u32 = 0x1f;
    /// `NV_ERR_INSERT_DUPLICATE_NAME`: the handle asked for is taken.
    pub const INSERT_DUPLICATE_NAME: u32 = 0x19;
    /// `NV_ERR_INVALID_CLIENT`: `hRoot`/`hClient` names no client.
    pub const INVALID_CLIENT: u32 = 0x23;
    /// `NV_ERR_INVALID_OBJECT_HANDLE`: the handle names no object of the client.
    pub const INVALID_OBJECT_HANDLE: u32 = 0x33;
    /// `NV_ERR_INVALID_OBJECT_PARENT`: the parent can't hold an object of that class.
    pub const INVALID_OBJECT_PARENT: u32 = 0x36;
    /// `NV_ERR_INVALID_CLASS`.
    pub const INVALID_CLASS: u32 = 0x22;
    /// `NV_ERR_INVALID_FLAGS`.
    pub const INVALID_FLAGS: u32 = 0x29;
    /// `NV_ERR_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: u32 = 0x56;
}

/// `/dev/nvidia-uvm` commands: plain numbers, not `_IOC`-encoded.
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

    /// A stable lowercase name for a UVM command, or `None` when gpuwarden doesn't name it.
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

/// Device numbers of the NVIDIA character devices.
pub mod devnum {
    /// Major number of `/dev/nvidiaN`, `/dev/nvidiactl` and `/dev/nvidia-modeset`.
    pub const MAJOR: u32 = 195;
    /// Minor number of `/dev/nvidiactl`.
    pub const CTL_MINOR: u32 = 255;
    /// Minor number of `/dev/nvidia-modeset`.
    pub const MODESET_MINOR: u32 = 254;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_escape_passes_the_command_filter_whatever_its_type_direction_and_size() {
        for nr in (0..=0xff).filter(|nr| esc::name(*nr).is_some()) {
            for ty in 0..=0xff {
                for (dir, size) in [(0, 0), (1, 4), (2, 16), (3, 32), (3, 0x3fff)] {
                    let cmd = (dir << 30) | (size << 16) | (ty << 8) | nr;
                    assert!(may_be_driver_ioctl(cmd), "escape {nr:#x} as {cmd:#x}");
                }
            }
        }
    }

    #[test]
    fn every_uvm_command_passes_the_command_filter() {
        for cmd in (0..0x100).chain([uvm::INITIALIZE, uvm::DEINITIALIZE]) {
            assert!(may_be_driver_ioctl(cmd), "{cmd:#x}");
        }
    }

    #[test]
    fn other_drivers_common_commands_do_not_pass() {
        // TCGETS, TCSETS, TIOCGWINSZ, FIONREAD, SIOCGIFCONF (SIOCGIFINDEX, 0x8933, does pass).
        for cmd in [0x5401, 0x5402, 0x5413, 0x541b, 0x8912] {
            assert!(!may_be_driver_ioctl(cmd), "{cmd:#x}");
        }
    }
}
