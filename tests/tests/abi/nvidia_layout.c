/*
 * The NVIDIA ABI the fake driver, the synthetic client and the agent's decoder rely on, as
 * NVIDIA's own headers (vendored under tests/vendor/open-gpu-kernel-modules, MIT) define it:
 * one `name value` line per constant, size and offset. tests/tests/abi_headers.rs compiles
 * this, runs it, and holds both the test-side table (tests/src/abi/nvidia.rs) and the
 * product's (agent-ebpf/common/src/nvidia.rs) to every line.
 */
#include <stddef.h>
#include <stdio.h>

#include "nvos.h"
#include "nvmisc.h"
#include "nv_escape.h"
#include "nv-ioctl-numbers.h"
#include "nv-ioctl.h"
#include "nv-unix-nvos-params-wrappers.h"
#include "class/cl0000.h"
#include "class/cl0001.h"
#include "class/cl003e.h"
#include "class/cl0040.h"
#include "class/cl0070.h"
#include "class/cl0071.h"
#include "class/cl0080.h"
#include "class/cl2080.h"
#include "class/cl50a0.h"
#include "ctrl/ctrl0000/ctrl0000gpu.h"

#define V(name, value) printf("%s %llu\n", name, (unsigned long long)(value))
#define SIZE(mod, type) V(mod ".SIZE", sizeof(type))
#define OFF(mod, NAME, type, field) V(mod "." NAME, offsetof(type, field))
/* A DRF field `hi:lo`: its shift and its mask after the shift. */
#define SHIFT(name, f) V(name, DRF_SHIFT(f))
#define MASK(name, f) V(name, DRF_MASK(f))

int main(void)
{
    V("NV_IOCTL_MAGIC", NV_IOCTL_MAGIC);

    V("esc.RM_ALLOC_MEMORY", NV_ESC_RM_ALLOC_MEMORY);
    V("esc.RM_FREE", NV_ESC_RM_FREE);
    V("esc.RM_CONTROL", NV_ESC_RM_CONTROL);
    V("esc.RM_ALLOC", NV_ESC_RM_ALLOC);
    V("esc.RM_DUP_OBJECT", NV_ESC_RM_DUP_OBJECT);
    V("esc.RM_SHARE", NV_ESC_RM_SHARE);
    V("esc.RM_I2C_ACCESS", NV_ESC_RM_I2C_ACCESS);
    V("esc.RM_IDLE_CHANNELS", NV_ESC_RM_IDLE_CHANNELS);
    V("esc.RM_VID_HEAP_CONTROL", NV_ESC_RM_VID_HEAP_CONTROL);
    V("esc.RM_ACCESS_REGISTRY", NV_ESC_RM_ACCESS_REGISTRY);
    V("esc.RM_MAP_MEMORY", NV_ESC_RM_MAP_MEMORY);
    V("esc.RM_UNMAP_MEMORY", NV_ESC_RM_UNMAP_MEMORY);
    V("esc.RM_GET_EVENT_DATA", NV_ESC_RM_GET_EVENT_DATA);
    V("esc.RM_ALLOC_CONTEXT_DMA2", NV_ESC_RM_ALLOC_CONTEXT_DMA2);
    V("esc.RM_ADD_VBLANK_CALLBACK", NV_ESC_RM_ADD_VBLANK_CALLBACK);
    V("esc.RM_MAP_MEMORY_DMA", NV_ESC_RM_MAP_MEMORY_DMA);
    V("esc.RM_UNMAP_MEMORY_DMA", NV_ESC_RM_UNMAP_MEMORY_DMA);
    V("esc.RM_BIND_CONTEXT_DMA", NV_ESC_RM_BIND_CONTEXT_DMA);
    V("esc.RM_EXPORT_OBJECT_TO_FD", NV_ESC_RM_EXPORT_OBJECT_TO_FD);
    V("esc.RM_IMPORT_OBJECT_FROM_FD", NV_ESC_RM_IMPORT_OBJECT_FROM_FD);
    V("esc.RM_UPDATE_DEVICE_MAPPING_INFO", NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO);
    V("esc.CARD_INFO", NV_ESC_CARD_INFO);
    V("esc.REGISTER_FD", NV_ESC_REGISTER_FD);
    V("esc.ALLOC_OS_EVENT", NV_ESC_ALLOC_OS_EVENT);
    V("esc.FREE_OS_EVENT", NV_ESC_FREE_OS_EVENT);
    V("esc.STATUS_CODE", NV_ESC_STATUS_CODE);
    V("esc.CHECK_VERSION_STR", NV_ESC_CHECK_VERSION_STR);
    V("esc.IOCTL_XFER_CMD", NV_ESC_IOCTL_XFER_CMD);
    V("esc.ATTACH_GPUS_TO_FD", NV_ESC_ATTACH_GPUS_TO_FD);
    V("esc.QUERY_DEVICE_INTR", NV_ESC_QUERY_DEVICE_INTR);
    V("esc.SYS_PARAMS", NV_ESC_SYS_PARAMS);
    V("esc.EXPORT_TO_DMABUF_FD", NV_ESC_EXPORT_TO_DMABUF_FD);
    V("esc.WAIT_OPEN_COMPLETE", NV_ESC_WAIT_OPEN_COMPLETE);

    SIZE("xfer", nv_ioctl_xfer_t);
    OFF("xfer", "CMD", nv_ioctl_xfer_t, cmd);
    OFF("xfer", "PARAMS_SIZE", nv_ioctl_xfer_t, size);
    OFF("xfer", "PTR", nv_ioctl_xfer_t, ptr);

    SIZE("nvos21", NVOS21_PARAMETERS);
    OFF("nvos21", "H_ROOT", NVOS21_PARAMETERS, hRoot);
    OFF("nvos21", "H_OBJECT_PARENT", NVOS21_PARAMETERS, hObjectParent);
    OFF("nvos21", "H_OBJECT_NEW", NVOS21_PARAMETERS, hObjectNew);
    OFF("nvos21", "H_CLASS", NVOS21_PARAMETERS, hClass);
    OFF("nvos21", "P_ALLOC_PARMS", NVOS21_PARAMETERS, pAllocParms);
    OFF("nvos21", "PARAMS_SIZE", NVOS21_PARAMETERS, paramsSize);
    OFF("nvos21", "STATUS", NVOS21_PARAMETERS, status);

    SIZE("nvos64", NVOS64_PARAMETERS);
    OFF("nvos64", "H_ROOT", NVOS64_PARAMETERS, hRoot);
    OFF("nvos64", "H_OBJECT_PARENT", NVOS64_PARAMETERS, hObjectParent);
    OFF("nvos64", "H_OBJECT_NEW", NVOS64_PARAMETERS, hObjectNew);
    OFF("nvos64", "H_CLASS", NVOS64_PARAMETERS, hClass);
    OFF("nvos64", "P_ALLOC_PARMS", NVOS64_PARAMETERS, pAllocParms);
    OFF("nvos64", "P_RIGHTS_REQUESTED", NVOS64_PARAMETERS, pRightsRequested);
    OFF("nvos64", "PARAMS_SIZE", NVOS64_PARAMETERS, paramsSize);
    OFF("nvos64", "FLAGS", NVOS64_PARAMETERS, flags);
    OFF("nvos64", "STATUS", NVOS64_PARAMETERS, status);

    SIZE("nvos00", NVOS00_PARAMETERS);
    OFF("nvos00", "H_ROOT", NVOS00_PARAMETERS, hRoot);
    OFF("nvos00", "H_OBJECT_PARENT", NVOS00_PARAMETERS, hObjectParent);
    OFF("nvos00", "H_OBJECT_OLD", NVOS00_PARAMETERS, hObjectOld);
    OFF("nvos00", "STATUS", NVOS00_PARAMETERS, status);

    SIZE("nvos54", NVOS54_PARAMETERS);
    OFF("nvos54", "H_CLIENT", NVOS54_PARAMETERS, hClient);
    OFF("nvos54", "H_OBJECT", NVOS54_PARAMETERS, hObject);
    OFF("nvos54", "CMD", NVOS54_PARAMETERS, cmd);
    OFF("nvos54", "FLAGS", NVOS54_PARAMETERS, flags);
    OFF("nvos54", "PARAMS", NVOS54_PARAMETERS, params);
    OFF("nvos54", "PARAMS_SIZE", NVOS54_PARAMETERS, paramsSize);
    OFF("nvos54", "STATUS", NVOS54_PARAMETERS, status);

    SIZE("nvos02", nv_ioctl_nvos02_parameters_with_fd);
    OFF("nvos02", "H_ROOT", nv_ioctl_nvos02_parameters_with_fd, params.hRoot);
    OFF("nvos02", "H_OBJECT_PARENT", nv_ioctl_nvos02_parameters_with_fd, params.hObjectParent);
    OFF("nvos02", "H_OBJECT_NEW", nv_ioctl_nvos02_parameters_with_fd, params.hObjectNew);
    OFF("nvos02", "H_CLASS", nv_ioctl_nvos02_parameters_with_fd, params.hClass);
    OFF("nvos02", "FLAGS", nv_ioctl_nvos02_parameters_with_fd, params.flags);
    OFF("nvos02", "P_MEMORY", nv_ioctl_nvos02_parameters_with_fd, params.pMemory);
    OFF("nvos02", "LIMIT", nv_ioctl_nvos02_parameters_with_fd, params.limit);
    OFF("nvos02", "STATUS", nv_ioctl_nvos02_parameters_with_fd, params.status);
    OFF("nvos02", "FD", nv_ioctl_nvos02_parameters_with_fd, fd);
    SHIFT("nvos02.FLAGS_LOCATION_SHIFT", NVOS02_FLAGS_LOCATION);
    MASK("nvos02.FLAGS_LOCATION_MASK", NVOS02_FLAGS_LOCATION);
    V("nvos02.LOCATION_PCI", NVOS02_FLAGS_LOCATION_PCI);
    V("nvos02.LOCATION_VIDMEM", NVOS02_FLAGS_LOCATION_VIDMEM);
    SHIFT("nvos02.FLAGS_ALLOC_SHIFT", NVOS02_FLAGS_ALLOC);
    V("nvos02.ALLOC_NONE", NVOS02_FLAGS_ALLOC_NONE);
    SHIFT("nvos02.FLAGS_MAPPING_SHIFT", NVOS02_FLAGS_MAPPING);
    V("nvos02.MAPPING_NO_MAP", NVOS02_FLAGS_MAPPING_NO_MAP);

    SIZE("nvos32", NVOS32_PARAMETERS);
    OFF("nvos32", "H_ROOT", NVOS32_PARAMETERS, hRoot);
    OFF("nvos32", "H_OBJECT_PARENT", NVOS32_PARAMETERS, hObjectParent);
    OFF("nvos32", "FUNCTION", NVOS32_PARAMETERS, function);
    OFF("nvos32", "STATUS", NVOS32_PARAMETERS, status);
    OFF("nvos32", "ALLOC_OWNER", NVOS32_PARAMETERS, data.AllocSize.owner);
    OFF("nvos32", "H_MEMORY", NVOS32_PARAMETERS, data.AllocSize.hMemory);
    OFF("nvos32", "FREE_H_MEMORY", NVOS32_PARAMETERS, data.Free.hMemory);
    OFF("nvos32", "ALLOC_TYPE", NVOS32_PARAMETERS, data.AllocSize.type);
    OFF("nvos32", "ALLOC_FLAGS", NVOS32_PARAMETERS, data.AllocSize.flags);
    OFF("nvos32", "ALLOC_ATTR", NVOS32_PARAMETERS, data.AllocSize.attr);
    OFF("nvos32", "ALLOC_SIZE", NVOS32_PARAMETERS, data.AllocSize.size);
    V("nvos32.FUNCTION_ALLOC_SIZE", NVOS32_FUNCTION_ALLOC_SIZE);
    V("nvos32.FUNCTION_FREE", NVOS32_FUNCTION_FREE);
    V("nvos32.FLAGS_MEMORY_HANDLE_PROVIDED", NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED);
    V("nvos32.FLAGS_VIRTUAL", NVOS32_ALLOC_FLAGS_VIRTUAL);
    SHIFT("nvos32.ATTR_LOCATION_SHIFT", NVOS32_ATTR_LOCATION);
    MASK("nvos32.ATTR_LOCATION_MASK", NVOS32_ATTR_LOCATION);
    V("nvos32.LOCATION_VIDMEM", NVOS32_ATTR_LOCATION_VIDMEM);
    V("nvos32.LOCATION_PCI", NVOS32_ATTR_LOCATION_PCI);
    V("nvos32.LOCATION_ANY", NVOS32_ATTR_LOCATION_ANY);

    SIZE("memory_alloc", NV_MEMORY_ALLOCATION_PARAMS);
    /* Drivers before 545.23.06 lacked the trailing numaNode (and its padding). */
    V("memory_alloc.SIZE_OLD", offsetof(NV_MEMORY_ALLOCATION_PARAMS, numaNode));
    OFF("memory_alloc", "OWNER", NV_MEMORY_ALLOCATION_PARAMS, owner);
    OFF("memory_alloc", "TYPE", NV_MEMORY_ALLOCATION_PARAMS, type);
    OFF("memory_alloc", "FLAGS", NV_MEMORY_ALLOCATION_PARAMS, flags);
    OFF("memory_alloc", "ATTR", NV_MEMORY_ALLOCATION_PARAMS, attr);
    OFF("memory_alloc", "SIZE_FIELD", NV_MEMORY_ALLOCATION_PARAMS, size);
    OFF("memory_alloc", "H_VA_SPACE", NV_MEMORY_ALLOCATION_PARAMS, hVASpace);
    V("memory_alloc.FLAGS_VIRTUAL", NVOS32_ALLOC_FLAGS_VIRTUAL);
    SHIFT("memory_alloc.ATTR_LOCATION_SHIFT", NVOS32_ATTR_LOCATION);
    MASK("memory_alloc.ATTR_LOCATION_MASK", NVOS32_ATTR_LOCATION);
    V("memory_alloc.ATTR_LOCATION_VIDMEM", NVOS32_ATTR_LOCATION_VIDMEM);
    V("memory_alloc.ATTR_LOCATION_PCI", NVOS32_ATTR_LOCATION_PCI);

    OFF("device_alloc", "DEVICE_ID", NV0080_ALLOC_PARAMETERS, deviceId);
    OFF("subdevice_alloc", "SUBDEVICE_ID", NV2080_ALLOC_PARAMETERS, subDeviceId);

    V("class.ROOT", NV01_ROOT);
    V("class.ROOT_NON_PRIV", NV01_ROOT_NON_PRIV);
    V("class.ROOT_CLIENT", NV01_ROOT_CLIENT);
    V("class.MEMORY_SYSTEM", NV01_MEMORY_SYSTEM);
    V("class.MEMORY_LOCAL_USER", NV01_MEMORY_LOCAL_USER);
    V("class.MEMORY_VIRTUAL", NV01_MEMORY_VIRTUAL);
    V("class.MEMORY_SYSTEM_OS_DESCRIPTOR", NV01_MEMORY_SYSTEM_OS_DESCRIPTOR);
    V("class.DEVICE_0", NV01_DEVICE_0);
    V("class.SUBDEVICE_0", NV20_SUBDEVICE_0);
    V("class.NV50_MEMORY_VIRTUAL", NV50_MEMORY_VIRTUAL);

    V("status.OK", NV_OK);
    V("status.NO_MEMORY", NV_ERR_NO_MEMORY);
    V("status.INSUFFICIENT_RESOURCES", NV_ERR_INSUFFICIENT_RESOURCES);
    V("status.INVALID_ARGUMENT", NV_ERR_INVALID_ARGUMENT);
    V("status.INSERT_DUPLICATE_NAME", NV_ERR_INSERT_DUPLICATE_NAME);
    V("status.INVALID_CLIENT", NV_ERR_INVALID_CLIENT);
    V("status.INVALID_OBJECT_HANDLE", NV_ERR_INVALID_OBJECT_HANDLE);
    V("status.INVALID_OBJECT_PARENT", NV_ERR_INVALID_OBJECT_PARENT);
    V("status.INVALID_CLASS", NV_ERR_INVALID_CLASS);
    V("status.INSUFFICIENT_PERMISSIONS", NV_ERR_INSUFFICIENT_PERMISSIONS);
    V("status.INVALID_STATE", NV_ERR_INVALID_STATE);
    V("status.INVALID_FLAGS", NV_ERR_INVALID_FLAGS);
    V("status.NOT_SUPPORTED", NV_ERR_NOT_SUPPORTED);

    /* The test side only (`gpuwarden_tests::abi`): what the fake driver answers with data. */
    V("ctrl.GPU_GET_ATTACHED_IDS", NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS);
    V("ctrl.ATTACHED_IDS_SIZE", sizeof(NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS));
    V("ctrl.MAX_ATTACHED_GPUS", NV0000_CTRL_GPU_MAX_ATTACHED_GPUS);
    V("ctrl.INVALID_GPU_ID", NV0000_CTRL_GPU_INVALID_ID);
    SIZE("card_info", nv_ioctl_card_info_t);
    OFF("card_info", "VALID", nv_ioctl_card_info_t, valid);
    OFF("card_info", "PCI_DOMAIN", nv_ioctl_card_info_t, pci_info.domain);
    OFF("card_info", "PCI_BUS", nv_ioctl_card_info_t, pci_info.bus);
    OFF("card_info", "PCI_VENDOR_ID", nv_ioctl_card_info_t, pci_info.vendor_id);
    OFF("card_info", "PCI_DEVICE_ID", nv_ioctl_card_info_t, pci_info.device_id);
    OFF("card_info", "GPU_ID", nv_ioctl_card_info_t, gpu_id);
    OFF("card_info", "FB_SIZE", nv_ioctl_card_info_t, fb_size);
    OFF("card_info", "MINOR_NUMBER", nv_ioctl_card_info_t, minor_number);
    SIZE("version", nv_ioctl_rm_api_version_t);
    OFF("version", "REPLY", nv_ioctl_rm_api_version_t, reply);
    V("version.REPLY_RECOGNIZED", NV_RM_API_VERSION_REPLY_RECOGNIZED);
    return 0;
}
