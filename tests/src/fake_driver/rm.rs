//! The fake resource manager: clients, their objects, and the video memory they hold.
//!
//! It answers the escapes of `/dev/nvidiactl` and `/dev/nvidiaN` on a parameter buffer, the way
//! `nvidia.ko` does after copying the struct in: RM errors go in the struct's `status` with the
//! ioctl succeeding; only a malformed ioctl (wrong size) fails it with an errno.

use std::collections::{BTreeMap, BTreeSet};

use crate::abi::nvidia::{
    class, esc, memory_alloc, nvos00, nvos02, nvos21, nvos32, nvos54, nvos64, smc_exec_partition,
    smc_partition, status, xfer,
};

use super::caller::CallerMemory;
use crate::{
    abi::{card_info, ctrl, version},
    bytes::{set_u32, set_u64, u32_at, u64_at},
};

/// Video memory is handed out in pages of this size (2 MiB, the real driver's large-page
/// granularity for `NV01_MEMORY_LOCAL_USER`), and the rounded size is written back into the
/// caller's `size` field.
pub const VIDMEM_PAGE: u64 = 2 << 20;

/// The first client handle is `CLIENT_HANDLE_BASE + 1`; client handles are unique across the
/// whole driver, like the real one's.
pub const CLIENT_HANDLE_BASE: u32 = 0xc1d0_0000;

/// The first object handle the driver picks is `OBJECT_HANDLE_BASE + 1`.
pub const OBJECT_HANDLE_BASE: u32 = 0xcaf0_0000;

/// The `gpuId` of GPU `index` in control calls and `CARD_INFO`.
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    reason = "a GPU index is below MAX_GPUS; `u32::try_from` is not const"
)]
pub const fn gpu_id(index: usize) -> u32 {
    // Real ids are PCI-derived (e.g. 0x100 for bus 1); keep that shape.
    ((index as u32) + 1) << 8
}

/// The largest parameter block `IOCTL_XFER_CMD` may carry (`NV_ABSOLUTE_MAX_IOCTL_SIZE`).
const XFER_MAX: u32 = 16384;

/// An errno for an ioctl the driver rejects outright.
pub(crate) type Errno = i32;

#[derive(Debug, Clone)]
struct Object {
    parent: u32,
    class: u32,
    /// The GPU of a device or subdevice, of what lives under one, and of video memory.
    gpu: Option<usize>,
    /// Memory held: video memory on `gpu`, or host memory when `host`.
    bytes: u64,
    /// `bytes` are host memory (system memory for the GPU, or user memory pinned for it).
    host: bool,
    /// The MIG GPU instance: the one a partition reference subscribes to, or the one video
    /// memory is charged to.
    instance: Option<u32>,
}

impl Object {
    /// Memory can be allocated under it: a device or a subdevice, as the driver requires of
    /// memory's parent.
    fn holds_memory(&self) -> bool {
        self.class == class::DEVICE_0 || self.class == class::SUBDEVICE_0
    }
}

#[derive(Debug)]
struct Client {
    /// The open file it was allocated through: closing that file frees the client.
    fh: u64,
    objects: BTreeMap<u32, Object>,
}

impl Client {
    /// The handle of a new object of this client (whose own handle is `me`): `requested`, or
    /// when that is 0 the first free one after `last` (the driver's last pick).
    fn new_handle(&self, me: u32, requested: u32, last: u32) -> Result<u32, u32> {
        if requested == 0 {
            let mut h = last.wrapping_add(1);
            while h == 0 || h == me || self.objects.contains_key(&h) {
                h = h.wrapping_add(1);
            }
            Ok(h)
        } else if requested == me || self.objects.contains_key(&requested) {
            Err(status::INSERT_DUPLICATE_NAME)
        } else {
            Ok(requested)
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Gpu {
    capacity: u64,
    used: u64,
}

/// A MIG GPU instance, and the video memory charged to it.
#[derive(Debug, Clone)]
struct Instance {
    spec: super::FakeInstance,
    used: u64,
}

/// Which struct an `RM_ALLOC` carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AllocForm {
    Nvos21,
    Nvos64,
}

/// The resource manager's state.
#[derive(Debug)]
pub(crate) struct Rm {
    gpus: Vec<Gpu>,
    /// MIG GPU instances: a GPU with any is in MIG mode.
    instances: Vec<Instance>,
    /// Host memory held for the GPUs (system memory objects and pinned user memory).
    sysmem: u64,
    clients: BTreeMap<u32, Client>,
    last_client: u32,
    last_object: u32,
}

impl Rm {
    /// A driver with one GPU per entry of `gpu_memory`, each that many bytes large.
    pub(crate) fn new(gpu_memory: &[u64]) -> Self {
        Self {
            gpus: gpu_memory
                .iter()
                .map(|&capacity| Gpu { capacity, used: 0 })
                .collect(),
            instances: Vec::new(),
            sysmem: 0,
            clients: BTreeMap::new(),
            last_client: CLIENT_HANDLE_BASE,
            last_object: OBJECT_HANDLE_BASE,
        }
    }

    /// The same driver with these MIG GPU instances (their GPUs in MIG mode).
    pub(crate) fn with_instances(mut self, instances: &[super::FakeInstance]) -> Self {
        self.instances = instances
            .iter()
            .map(|spec| Instance {
                spec: spec.clone(),
                used: 0,
            })
            .collect();
        self
    }

    /// Video memory held per MIG GPU instance, by (GPU, GPU instance id).
    pub(crate) fn instance_used(&self) -> BTreeMap<(usize, u32), u64> {
        self.instances
            .iter()
            .map(|i| ((i.spec.gpu, i.spec.gpu_instance), i.used))
            .collect()
    }

    fn instance_mut(&mut self, gpu: usize, gi: u32) -> Option<&mut Instance> {
        self.instances
            .iter_mut()
            .find(|i| i.spec.gpu == gpu && i.spec.gpu_instance == gi)
    }

    fn in_mig_mode(&self, gpu: usize) -> bool {
        self.instances.iter().any(|i| i.spec.gpu == gpu)
    }

    /// Where `bytes` of video memory `client` allocates on `gpu` go: on a GPU in MIG mode, the
    /// GPU instance the client subscribed to (refused without one, or past the instance's
    /// memory); checked against the GPU's capacity too. Charges nothing.
    fn place_vidmem(&self, client: u32, gpu: usize, bytes: u64) -> Result<Option<u32>, u32> {
        let g = self.gpus[gpu];
        if g.used.checked_add(bytes).is_none_or(|u| u > g.capacity) {
            return Err(status::NO_MEMORY);
        }
        if !self.in_mig_mode(gpu) {
            return Ok(None);
        }
        // The fake's choice of code: a client on a GPU in MIG mode must subscribe first.
        let gi = self
            .clients
            .get(&client)
            .and_then(|c| {
                c.objects
                    .values()
                    .find(|o| o.class == class::SMC_PARTITION_REF && o.gpu == Some(gpu))
            })
            .and_then(|o| o.instance)
            .ok_or(status::INSUFFICIENT_PERMISSIONS)?;
        let i = self
            .instances
            .iter()
            .find(|i| i.spec.gpu == gpu && i.spec.gpu_instance == gi)
            .ok_or(status::INVALID_STATE)?;
        if i.used.checked_add(bytes).is_none_or(|u| u > i.spec.memory) {
            return Err(status::NO_MEMORY);
        }
        Ok(Some(gi))
    }

    /// Charges video memory placed by [`Self::place_vidmem`].
    fn charge_vidmem(&mut self, gpu: usize, instance: Option<u32>, bytes: u64) {
        self.gpus[gpu].used += bytes;
        if let Some(i) = instance.and_then(|gi| self.instance_mut(gpu, gi)) {
            i.used += bytes;
        }
    }

    /// `AMPERE_SMC_PARTITION_REF` under subdevice `parent` on `gpu`: the GPU instance its
    /// `swizzId` names, when the caller's `capDescriptor` is an open file of that instance's
    /// capability node (`nvidia-cap<minor>`, minor as [`super::FakeDriver::mig_minors`] lists
    /// it) and the client has no subscription on the GPU yet.
    fn subscribe(
        &self,
        mem: &dyn CallerMemory,
        r: &AllocRequest,
        client: &Client,
        gpu: usize,
    ) -> Result<u32, u32> {
        if r.params_size != smc_partition::SIZE {
            return Err(status::INVALID_ARGUMENT);
        }
        let raw = mem
            .read(r.params, smc_partition::SIZE as usize)
            .map_err(|_| status::INVALID_ARGUMENT)?;
        let fd = u64_at(&raw, smc_partition::CAP_DESCRIPTOR);
        let gi = u32_at(&raw, smc_partition::SWIZZ_ID);
        if !self.in_mig_mode(gpu) {
            return Err(status::INVALID_STATE);
        }
        let instance = self
            .instances
            .iter()
            .find(|i| i.spec.gpu == gpu && i.spec.gpu_instance == gi)
            .ok_or(status::INVALID_ARGUMENT)?;
        let wanted = format!("nvidia-cap{}", super::gi_cap_minor(&instance.spec));
        let opened = mem.fd_path(fd);
        if opened
            .as_deref()
            .and_then(std::path::Path::file_name)
            .is_none_or(|n| n != wanted.as_str())
        {
            return Err(status::INSUFFICIENT_PERMISSIONS);
        }
        if client
            .objects
            .values()
            .any(|o| o.class == class::SMC_PARTITION_REF && o.gpu == Some(gpu))
        {
            return Err(status::INVALID_STATE);
        }
        Ok(gi)
    }

    /// Video memory held per GPU.
    pub(crate) fn used(&self) -> Vec<u64> {
        self.gpus.iter().map(|g| g.used).collect()
    }

    /// Host memory held for the GPUs.
    pub(crate) fn sysmem(&self) -> u64 {
        self.sysmem
    }

    /// Video memory held per GPU by each live client.
    pub(crate) fn used_by_client(&self) -> BTreeMap<u32, Vec<u64>> {
        self.clients
            .iter()
            .map(|(&h, c)| {
                let mut per_gpu = vec![0; self.gpus.len()];
                for o in c.objects.values().filter(|o| !o.host) {
                    if let Some(slot) = o.gpu.and_then(|g| per_gpu.get_mut(g)) {
                        *slot += o.bytes;
                    }
                }
                (h, per_gpu)
            })
            .collect()
    }

    /// Live clients.
    pub(crate) fn clients(&self) -> usize {
        self.clients.len()
    }

    /// Answers escape `nr` whose `size`-byte params are `params` (edited in place), issued
    /// through open file `fh`. Returns the escape's name as counted (an `IOCTL_XFER_CMD` counts as
    /// the escape it carries).
    pub(crate) fn escape(
        &mut self,
        mem: &dyn CallerMemory,
        fh: u64,
        nr: u32,
        params: &mut [u8],
    ) -> Result<&'static str, Errno> {
        let size = u32::try_from(params.len()).map_err(|_| libc::EINVAL)?;
        let name = esc::name(nr).unwrap_or("unknown");
        match (nr, size) {
            (esc::RM_ALLOC, nvos21::SIZE) => self.alloc(mem, fh, AllocForm::Nvos21, params),
            (esc::RM_ALLOC, nvos64::SIZE) => self.alloc(mem, fh, AllocForm::Nvos64, params),
            (esc::RM_FREE, nvos00::SIZE) => self.free(params),
            (esc::RM_ALLOC_MEMORY, nvos02::SIZE) => self.alloc_memory(params),
            (esc::RM_VID_HEAP_CONTROL, nvos32::SIZE) => self.vid_heap(params),
            (esc::RM_CONTROL, nvos54::SIZE) => self.control(mem, params),
            (esc::IOCTL_XFER_CMD, xfer::SIZE) => return self.xfer(mem, fh, params),
            (esc::CARD_INFO, _) if size > 0 && size % card_info::SIZE == 0 => {
                self.card_info(params);
            }
            (esc::CHECK_VERSION_STR, 72) => {
                set_u32(params, version::REPLY, version::REPLY_RECOGNIZED);
            }
            // The escapes above at a size they don't take.
            (
                esc::RM_ALLOC
                | esc::RM_FREE
                | esc::RM_ALLOC_MEMORY
                | esc::RM_VID_HEAP_CONTROL
                | esc::RM_CONTROL
                | esc::IOCTL_XFER_CMD
                | esc::CARD_INFO
                | esc::CHECK_VERSION_STR,
                _,
            )
            | (esc::REGISTER_FD, 0..=3 | 5..) => return Err(libc::EINVAL),
            // Fd registration, attaching GPUs and the escapes the fake doesn't model: success,
            // params untouched.
            _ => {}
        }
        Ok(name)
    }

    /// Frees every client allocated through open file `fh` (the file was closed).
    pub(crate) fn release(&mut self, fh: u64) {
        let owned: Vec<u32> = self
            .clients
            .iter()
            .filter(|(_, c)| c.fh == fh)
            .map(|(&h, _)| h)
            .collect();
        for h in owned {
            self.free_client(h);
        }
    }

    fn xfer(
        &mut self,
        mem: &dyn CallerMemory,
        fh: u64,
        params: &[u8],
    ) -> Result<&'static str, Errno> {
        let inner_nr = u32_at(params, xfer::CMD);
        let inner_size = u32_at(params, xfer::PARAMS_SIZE);
        let ptr = u64_at(params, xfer::PTR);
        if inner_nr == esc::IOCTL_XFER_CMD || inner_size == 0 || inner_size > XFER_MAX {
            return Err(libc::EINVAL);
        }
        let mut inner = mem
            .read(ptr, inner_size as usize)
            .map_err(|_| libc::EFAULT)?;
        let name = self.escape(mem, fh, inner_nr, &mut inner)?;
        mem.write(ptr, &inner).map_err(|_| libc::EFAULT)?;
        Ok(name)
    }

    fn alloc(&mut self, mem: &dyn CallerMemory, fh: u64, form: AllocForm, params: &mut [u8]) {
        let (params_size_at, status_at) = match form {
            AllocForm::Nvos21 => (nvos21::PARAMS_SIZE, nvos21::STATUS),
            AllocForm::Nvos64 => (nvos64::PARAMS_SIZE, nvos64::STATUS),
        };
        let request = AllocRequest {
            client: u32_at(params, nvos21::H_ROOT),
            parent: u32_at(params, nvos21::H_OBJECT_PARENT),
            handle: u32_at(params, nvos21::H_OBJECT_NEW),
            class: u32_at(params, nvos21::H_CLASS),
            params: u64_at(params, nvos21::P_ALLOC_PARMS),
            params_size: u32_at(params, params_size_at),
        };
        let result = if class::is_client(request.class) {
            self.alloc_client(fh, request.handle)
        } else {
            self.alloc_object(mem, &request)
        };
        let rm_status = match result {
            Ok(handle) => {
                set_u32(params, nvos21::H_OBJECT_NEW, handle);
                status::OK
            }
            Err(s) => s,
        };
        set_u32(params, status_at, rm_status);
    }

    fn alloc_client(&mut self, fh: u64, requested: u32) -> Result<u32, u32> {
        let handle = if requested == 0 {
            let mut h = self.last_client.wrapping_add(1);
            while h == 0 || self.clients.contains_key(&h) {
                h = h.wrapping_add(1);
            }
            self.last_client = h;
            h
        } else if self.clients.contains_key(&requested) {
            return Err(status::INSERT_DUPLICATE_NAME);
        } else {
            requested
        };
        self.clients.insert(
            handle,
            Client {
                fh,
                objects: BTreeMap::new(),
            },
        );
        Ok(handle)
    }

    #[expect(
        clippy::too_many_lines,
        reason = "one arm per control command the fake driver answers"
    )]
    fn alloc_object(&mut self, mem: &dyn CallerMemory, r: &AllocRequest) -> Result<u32, u32> {
        let gpus = self.gpus.len();
        let client = self.clients.get(&r.client).ok_or(status::INVALID_CLIENT)?;
        let parent = if r.parent == r.client {
            None
        } else {
            Some(
                client
                    .objects
                    .get(&r.parent)
                    .ok_or(status::INVALID_OBJECT_PARENT)?,
            )
        };
        let handle = client.new_handle(r.client, r.handle, self.last_object)?;
        let mut host = false;
        let mut instance = None;
        let (gpu, bytes) = match r.class {
            class::SMC_PARTITION_REF => match parent {
                Some(p) if p.class == class::SUBDEVICE_0 => {
                    let gpu = p.gpu.ok_or(status::INVALID_OBJECT_PARENT)?;
                    instance = Some(self.subscribe(mem, r, client, gpu)?);
                    (Some(gpu), 0)
                }
                _ => return Err(status::INVALID_OBJECT_PARENT),
            },
            class::SMC_EXEC_PARTITION_REF => match parent {
                Some(p) if p.class == class::SMC_PARTITION_REF => {
                    if r.params_size != smc_exec_partition::SIZE {
                        return Err(status::INVALID_ARGUMENT);
                    }
                    let raw = mem
                        .read(r.params, smc_exec_partition::SIZE as usize)
                        .map_err(|_| status::INVALID_ARGUMENT)?;
                    let ci = u32_at(&raw, smc_exec_partition::EXEC_PARTITION_ID);
                    let known = self.instances.iter().any(|i| {
                        Some(i.spec.gpu) == p.gpu
                            && Some(i.spec.gpu_instance) == p.instance
                            && i.spec.compute_instances.contains(&ci)
                    });
                    if !known {
                        return Err(status::INVALID_ARGUMENT);
                    }
                    (p.gpu, 0)
                }
                _ => return Err(status::INVALID_OBJECT_PARENT),
            },
            class::DEVICE_0 => {
                if parent.is_some() {
                    return Err(status::INVALID_OBJECT_PARENT);
                }
                let raw = mem
                    .read(r.params, 4)
                    .map_err(|_| status::INVALID_ARGUMENT)?;
                let device_id = u32_at(&raw, 0) as usize;
                if device_id >= gpus {
                    return Err(status::INVALID_ARGUMENT);
                }
                (Some(device_id), 0)
            }
            class::SUBDEVICE_0 => match parent {
                Some(p) if p.class == class::DEVICE_0 => (p.gpu, 0),
                _ => return Err(status::INVALID_OBJECT_PARENT),
            },
            class::MEMORY_LOCAL_USER => {
                if r.params_size != memory_alloc::SIZE && r.params_size != memory_alloc::SIZE_OLD {
                    return Err(status::INVALID_ARGUMENT);
                }
                let gpu = parent
                    .filter(|p| p.holds_memory())
                    .and_then(|p| p.gpu)
                    .ok_or(status::INVALID_OBJECT_PARENT)?;
                let size_at = r
                    .params
                    .checked_add(memory_alloc::SIZE_FIELD as u64)
                    .ok_or(status::INVALID_ARGUMENT)?;
                let raw = mem.read(size_at, 8).map_err(|_| status::INVALID_ARGUMENT)?;
                let asked = u64_at(&raw, 0);
                if asked == 0 {
                    return Err(status::INVALID_ARGUMENT);
                }
                let rounded = asked
                    .div_ceil(VIDMEM_PAGE)
                    .checked_mul(VIDMEM_PAGE)
                    .ok_or(status::NO_MEMORY)?;
                instance = self.place_vidmem(r.client, gpu, rounded)?;
                // Write back the size allocated, as the driver does, before charging it.
                mem.write(size_at, &rounded.to_le_bytes())
                    .map_err(|_| status::INVALID_ARGUMENT)?;
                (Some(gpu), rounded)
            }
            class::MEMORY_SYSTEM => {
                if r.params_size != memory_alloc::SIZE && r.params_size != memory_alloc::SIZE_OLD {
                    return Err(status::INVALID_ARGUMENT);
                }
                let size_at = r
                    .params
                    .checked_add(memory_alloc::SIZE_FIELD as u64)
                    .ok_or(status::INVALID_ARGUMENT)?;
                let raw = mem.read(size_at, 8).map_err(|_| status::INVALID_ARGUMENT)?;
                let asked = u64_at(&raw, 0);
                if asked == 0 {
                    return Err(status::INVALID_ARGUMENT);
                }
                let parent = parent
                    .filter(|p| p.holds_memory())
                    .ok_or(status::INVALID_OBJECT_PARENT)?;
                host = true;
                (parent.gpu, asked)
            }
            // Virtual ranges (`NV50_MEMORY_VIRTUAL`, `NV01_MEMORY_VIRTUAL`) and every other
            // class: held, charged nothing.
            _ => (parent.and_then(|p| p.gpu), 0),
        };
        if host {
            // Host memory has no capacity here, but it can't exceed the address space.
            self.sysmem = self.sysmem.checked_add(bytes).ok_or(status::NO_MEMORY)?;
        } else if let Some(g) = gpu.filter(|_| bytes > 0) {
            self.charge_vidmem(g, instance, bytes);
        }
        if r.handle == 0 {
            self.last_object = handle;
        }
        if let Some(c) = self.clients.get_mut(&r.client) {
            c.objects.insert(
                handle,
                Object {
                    parent: r.parent,
                    class: r.class,
                    gpu,
                    bytes,
                    host,
                    instance,
                },
            );
        }
        Ok(handle)
    }

    fn free(&mut self, params: &mut [u8]) {
        let client = u32_at(params, nvos00::H_ROOT);
        let old = u32_at(params, nvos00::H_OBJECT_OLD);
        let rm_status = if client == old {
            if self.free_client(client) {
                status::OK
            } else {
                status::INVALID_CLIENT
            }
        } else {
            self.free_object(client, old)
        };
        set_u32(params, nvos00::STATUS, rm_status);
    }

    fn free_client(&mut self, handle: u32) -> bool {
        let Some(client) = self.clients.remove(&handle) else {
            return false;
        };
        for o in client.objects.values() {
            self.uncharge(o);
        }
        true
    }

    /// Frees `handle` and everything under it.
    fn free_object(&mut self, client: u32, handle: u32) -> u32 {
        let Some(c) = self.clients.get_mut(&client) else {
            return status::INVALID_CLIENT;
        };
        if !c.objects.contains_key(&handle) {
            return status::INVALID_OBJECT_HANDLE;
        }
        let mut doomed = BTreeSet::from([handle]);
        loop {
            let more: Vec<u32> = c
                .objects
                .iter()
                .filter(|(h, o)| doomed.contains(&o.parent) && !doomed.contains(h))
                .map(|(&h, _)| h)
                .collect();
            if more.is_empty() {
                break;
            }
            doomed.extend(more);
        }
        let freed: Vec<Object> = doomed.iter().filter_map(|h| c.objects.remove(h)).collect();
        for o in &freed {
            self.uncharge(o);
        }
        status::OK
    }

    fn uncharge(&mut self, o: &Object) {
        if o.host {
            self.sysmem = self.sysmem.saturating_sub(o.bytes);
            return;
        }
        if let Some(g) = o.gpu.and_then(|g| self.gpus.get_mut(g)) {
            g.used = g.used.saturating_sub(o.bytes);
        }
        // A partition reference's `instance` is its subscription, which holds no memory.
        if o.bytes > 0
            && let (Some(gpu), Some(gi)) = (o.gpu, o.instance)
            && let Some(i) = self.instance_mut(gpu, gi)
        {
            i.used = i.used.saturating_sub(o.bytes);
        }
    }

    /// Adds memory under `parent` (which must be a device or subdevice) as `requested` (0: the
    /// driver picks); returns its handle.
    fn add_object(
        &mut self,
        client: u32,
        parent: u32,
        requested: u32,
        class: u32,
        (bytes, host): (u64, bool),
    ) -> Result<u32, u32> {
        let c = self.clients.get(&client).ok_or(status::INVALID_CLIENT)?;
        let gpu = c
            .objects
            .get(&parent)
            .filter(|p| p.holds_memory())
            .ok_or(status::INVALID_OBJECT_PARENT)?
            .gpu;
        let handle = c.new_handle(client, requested, self.last_object)?;
        if requested == 0 {
            self.last_object = handle;
        }
        let mut instance = None;
        if !host && bytes > 0 {
            let g = gpu.ok_or(status::INVALID_OBJECT_PARENT)?;
            instance = self.place_vidmem(client, g, bytes)?;
            self.charge_vidmem(g, instance, bytes);
        } else if host {
            self.sysmem = self.sysmem.checked_add(bytes).ok_or(status::NO_MEMORY)?;
        }
        if let Some(c) = self.clients.get_mut(&client) {
            c.objects.insert(
                handle,
                Object {
                    parent,
                    class,
                    gpu,
                    bytes,
                    host,
                    instance,
                },
            );
        }
        Ok(handle)
    }

    /// `RM_ALLOC_MEMORY` (`Nv01AllocMemory`): system memory (`NV01_MEMORY_SYSTEM`, `limit + 1`
    /// bytes of host memory), user memory pinned for the GPU (`NV01_MEMORY_SYSTEM_OS_DESCRIPTOR`,
    /// `limit + 1` bytes at `pMemory`), or a view of the whole framebuffer
    /// (`NV01_MEMORY_LOCAL_USER`: no memory allocated, `limit` answered as the GPU's size minus
    /// one). The flags are checked as the driver checks them; the CPU mapping the driver makes
    /// of system memory without `_MAPPING_NO_MAP` is not made (`pMemory` stays as given).
    fn alloc_memory(&mut self, params: &mut [u8]) {
        let client = u32_at(params, nvos02::H_ROOT);
        let parent = u32_at(params, nvos02::H_OBJECT_PARENT);
        let handle = u32_at(params, nvos02::H_OBJECT_NEW);
        let class = u32_at(params, nvos02::H_CLASS);
        let flags = u32_at(params, nvos02::FLAGS);
        let limit = u64_at(params, nvos02::LIMIT);
        let location = (flags >> nvos02::FLAGS_LOCATION_SHIFT) & nvos02::FLAGS_LOCATION_MASK;
        let alloc = (flags >> nvos02::FLAGS_ALLOC_SHIFT) & 0x3;
        let mapping = flags >> nvos02::FLAGS_MAPPING_SHIFT;
        let result = match class {
            class::MEMORY_SYSTEM
                if location != nvos02::LOCATION_PCI || alloc == nvos02::ALLOC_NONE =>
            {
                Err(status::INVALID_FLAGS)
            }
            class::MEMORY_SYSTEM_OS_DESCRIPTOR
                if location != nvos02::LOCATION_PCI || mapping != nvos02::MAPPING_NO_MAP =>
            {
                Err(status::INVALID_FLAGS)
            }
            class::MEMORY_SYSTEM | class::MEMORY_SYSTEM_OS_DESCRIPTOR => match limit.checked_add(1)
            {
                Some(bytes) => self.add_object(client, parent, handle, class, (bytes, true)),
                None => Err(status::INVALID_ARGUMENT),
            },
            class::MEMORY_LOCAL_USER => {
                let view = self.add_object(client, parent, handle, class, (0, false));
                let gpu = self
                    .clients
                    .get(&client)
                    .and_then(|c| c.objects.get(&parent))
                    .and_then(|o| o.gpu);
                if let (Ok(_), Some(g)) = (view, gpu) {
                    set_u64(params, nvos02::LIMIT, self.gpus[g].capacity - 1);
                }
                view
            }
            _ => Err(status::INVALID_CLASS),
        };
        let rm_status = match result {
            Ok(h) => {
                set_u32(params, nvos02::H_OBJECT_NEW, h);
                status::OK
            }
            Err(s) => s,
        };
        set_u32(params, nvos02::STATUS, rm_status);
    }

    /// `RM_VID_HEAP_CONTROL` (`Nv04VidHeapControl`): `ALLOC_SIZE` allocates video memory
    /// (`NVOS32_ATTR_LOCATION_VIDMEM` or `_ANY`, rounded up to [`VIDMEM_PAGE`] and the size
    /// written back) or host memory (`_PCI`); `NVOS32_ALLOC_FLAGS_VIRTUAL` holds nothing.
    /// `hMemory` is the caller's with `NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED`, else picked and
    /// written back. `FREE` frees `hMemory`. Other functions answer `NV_ERR_NOT_SUPPORTED` (the
    /// fake doesn't model them).
    fn vid_heap(&mut self, params: &mut [u8]) {
        let client = u32_at(params, nvos32::H_ROOT);
        let parent = u32_at(params, nvos32::H_OBJECT_PARENT);
        let rm_status = match u32_at(params, nvos32::FUNCTION) {
            nvos32::FUNCTION_ALLOC_SIZE => {
                let flags = u32_at(params, nvos32::ALLOC_FLAGS);
                let attr = u32_at(params, nvos32::ALLOC_ATTR);
                let asked = u64_at(params, nvos32::ALLOC_SIZE);
                let location = (attr >> nvos32::ATTR_LOCATION_SHIFT) & nvos32::ATTR_LOCATION_MASK;
                let requested = if flags & nvos32::FLAGS_MEMORY_HANDLE_PROVIDED != 0 {
                    u32_at(params, nvos32::H_MEMORY)
                } else {
                    0
                };
                let held = if asked == 0 {
                    Err(status::INVALID_ARGUMENT)
                } else if flags & nvos32::FLAGS_VIRTUAL != 0 {
                    Ok((0, false, asked))
                } else if location == nvos32::LOCATION_PCI {
                    Ok((asked, true, asked))
                } else {
                    asked
                        .div_ceil(VIDMEM_PAGE)
                        .checked_mul(VIDMEM_PAGE)
                        .map(|r| (r, false, r))
                        .ok_or(status::NO_MEMORY)
                };
                match held.and_then(|(bytes, host, size)| {
                    self.add_object(
                        client,
                        parent,
                        requested,
                        class::MEMORY_LOCAL_USER,
                        (bytes, host),
                    )
                    .map(|h| (h, size))
                }) {
                    Ok((h, size)) => {
                        set_u32(params, nvos32::H_MEMORY, h);
                        set_u64(params, nvos32::ALLOC_SIZE, size);
                        status::OK
                    }
                    Err(s) => s,
                }
            }
            nvos32::FUNCTION_FREE => self.free_object(client, u32_at(params, nvos32::H_MEMORY)),
            _ => status::NOT_SUPPORTED,
        };
        set_u32(params, nvos32::STATUS, rm_status);
    }

    fn control(&mut self, mem: &dyn CallerMemory, params: &mut [u8]) {
        let client = u32_at(params, nvos54::H_CLIENT);
        let object = u32_at(params, nvos54::H_OBJECT);
        let cmd = u32_at(params, nvos54::CMD);
        let ptr = u64_at(params, nvos54::PARAMS);
        let size = u32_at(params, nvos54::PARAMS_SIZE);
        let rm_status = match self.clients.get(&client) {
            None => status::INVALID_CLIENT,
            Some(c) if object != client && !c.objects.contains_key(&object) => {
                status::INVALID_OBJECT_HANDLE
            }
            Some(_) if cmd == ctrl::GPU_GET_ATTACHED_IDS => {
                if size == ctrl::ATTACHED_IDS_SIZE {
                    let mut ids = [0u8; ctrl::ATTACHED_IDS_SIZE as usize];
                    for i in 0..ctrl::MAX_ATTACHED_GPUS {
                        let id = if i < self.gpus.len() {
                            gpu_id(i)
                        } else {
                            ctrl::INVALID_GPU_ID
                        };
                        set_u32(&mut ids, i * 4, id);
                    }
                    match mem.write(ptr, &ids) {
                        Ok(()) => status::OK,
                        Err(_) => status::INVALID_ARGUMENT,
                    }
                } else {
                    status::INVALID_ARGUMENT
                }
            }
            // Every other command succeeds without answering anything.
            Some(_) => status::OK,
        };
        set_u32(params, nvos54::STATUS, rm_status);
    }

    fn card_info(&self, params: &mut [u8]) {
        let entry = card_info::SIZE as usize;
        for (i, (card, gpu)) in params.chunks_mut(entry).zip(&self.gpus).enumerate() {
            card.fill(0);
            card[card_info::VALID] = 1;
            set_u32(card, card_info::PCI_DOMAIN, 0);
            card[card_info::PCI_BUS] = u8::try_from(i + 1).unwrap_or(u8::MAX);
            card[card_info::PCI_VENDOR_ID..card_info::PCI_VENDOR_ID + 2]
                .copy_from_slice(&0x10de_u16.to_le_bytes());
            card[card_info::PCI_DEVICE_ID..card_info::PCI_DEVICE_ID + 2]
                .copy_from_slice(&0x2330_u16.to_le_bytes());
            set_u32(card, card_info::GPU_ID, gpu_id(i));
            set_u64(card, card_info::FB_SIZE, gpu.capacity);
            set_u32(
                card,
                card_info::MINOR_NUMBER,
                u32::try_from(i).unwrap_or(u32::MAX),
            );
        }
    }
}

/// The fields of an `RM_ALLOC` the driver reads (same offsets in both forms up to `pAllocParms`).
struct AllocRequest {
    client: u32,
    parent: u32,
    handle: u32,
    class: u32,
    params: u64,
    params_size: u32,
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod agent_decoder;
