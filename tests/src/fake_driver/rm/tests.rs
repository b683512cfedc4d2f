use std::{cell::RefCell, collections::HashMap};

use crate::abi::nvidia::ioctl_cmd;

use super::*;
use crate::fake_driver::caller::Fault;

const MIB: u64 = 1 << 20;

/// A caller whose memory is a few buffers at made-up addresses.
#[derive(Default)]
pub(super) struct FakeMemory {
    regions: RefCell<HashMap<u64, Vec<u8>>>,
    /// The caller's descriptors.
    pub(super) fds: RefCell<HashMap<u64, std::path::PathBuf>>,
}

impl FakeMemory {
    pub(super) fn put(&self, addr: u64, data: Vec<u8>) -> u64 {
        self.regions.borrow_mut().insert(addr, data);
        addr
    }

    pub(super) fn get(&self, addr: u64) -> Vec<u8> {
        self.regions.borrow()[&addr].clone()
    }

    fn locate(&self, addr: u64, len: usize) -> Option<(u64, usize)> {
        self.regions.borrow().iter().find_map(|(&base, data)| {
            let off = usize::try_from(addr.checked_sub(base)?).ok()?;
            (off + len <= data.len()).then_some((base, off))
        })
    }
}

impl CallerMemory for FakeMemory {
    fn fd_path(&self, fd: u64) -> Option<std::path::PathBuf> {
        self.fds.borrow().get(&fd).cloned()
    }

    fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, Fault> {
        let (base, off) = self.locate(addr, len).ok_or(Fault)?;
        Ok(self.regions.borrow()[&base][off..off + len].to_vec())
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        let (base, off) = self.locate(addr, data.len()).ok_or(Fault)?;
        self.regions.borrow_mut().get_mut(&base).ok_or(Fault)?[off..off + data.len()]
            .copy_from_slice(data);
        Ok(())
    }
}

struct Harness {
    rm: Rm,
    mem: FakeMemory,
    next_addr: u64,
}

impl Harness {
    fn new(gpu_memory: &[u64]) -> Self {
        Self {
            rm: Rm::new(gpu_memory),
            mem: FakeMemory::default(),
            next_addr: 0x1000,
        }
    }

    fn buffer(&mut self, data: Vec<u8>) -> u64 {
        self.next_addr += 0x10000;
        self.mem.put(self.next_addr, data)
    }

    fn alloc(
        &mut self,
        form: AllocForm,
        client: u32,
        parent: u32,
        class: u32,
        alloc_params: Option<u64>,
        params_size: u32,
    ) -> (u32, u32) {
        let size = if form == AllocForm::Nvos21 {
            nvos21::SIZE
        } else {
            nvos64::SIZE
        };
        let mut p = vec![0u8; size as usize];
        set_u32(&mut p, nvos21::H_ROOT, client);
        set_u32(&mut p, nvos21::H_OBJECT_PARENT, parent);
        set_u32(&mut p, nvos21::H_CLASS, class);
        set_u64(&mut p, nvos21::P_ALLOC_PARMS, alloc_params.unwrap_or(0));
        let (size_at, status_at) = if form == AllocForm::Nvos21 {
            (nvos21::PARAMS_SIZE, nvos21::STATUS)
        } else {
            (nvos64::PARAMS_SIZE, nvos64::STATUS)
        };
        set_u32(&mut p, size_at, params_size);
        assert_eq!(
            self.rm.escape(&self.mem, 1, esc::RM_ALLOC, &mut p),
            Ok("rm_alloc")
        );
        (u32_at(&p, nvos21::H_OBJECT_NEW), u32_at(&p, status_at))
    }

    fn client(&mut self) -> u32 {
        let (h, s) = self.alloc(AllocForm::Nvos21, 0, 0, class::ROOT_CLIENT, None, 0);
        assert_eq!(s, status::OK);
        h
    }

    fn device(&mut self, client: u32, id: u32) -> (u32, u32) {
        let p = self.buffer(id.to_le_bytes().to_vec());
        self.alloc(
            AllocForm::Nvos21,
            client,
            client,
            class::DEVICE_0,
            Some(p),
            56,
        )
    }

    /// Allocates video memory; returns (handle, status, size written back).
    fn vidmem(
        &mut self,
        form: AllocForm,
        client: u32,
        parent: u32,
        bytes: u64,
        params_size: u32,
    ) -> (u32, u32, u64) {
        let mut m = vec![0u8; params_size as usize];
        set_u64(&mut m, memory_alloc::SIZE_FIELD, bytes);
        let addr = self.buffer(m);
        let (h, s) = self.alloc(
            form,
            client,
            parent,
            class::MEMORY_LOCAL_USER,
            Some(addr),
            params_size,
        );
        let written = u64_at(&self.mem.get(addr), memory_alloc::SIZE_FIELD);
        (h, s, written)
    }

    fn free(&mut self, client: u32, parent: u32, old: u32) -> u32 {
        let mut p = vec![0u8; nvos00::SIZE as usize];
        set_u32(&mut p, nvos00::H_ROOT, client);
        set_u32(&mut p, nvos00::H_OBJECT_PARENT, parent);
        set_u32(&mut p, nvos00::H_OBJECT_OLD, old);
        assert_eq!(
            self.rm.escape(&self.mem, 1, esc::RM_FREE, &mut p),
            Ok("rm_free")
        );
        u32_at(&p, nvos00::STATUS)
    }
}

#[test]
fn handles_follow_the_documented_numbering() {
    let mut h = Harness::new(&[1 << 30]);
    let c = h.client();
    assert_eq!(c, CLIENT_HANDLE_BASE + 1);
    assert_eq!(h.device(c, 0), (OBJECT_HANDLE_BASE + 1, status::OK));
    assert_eq!(h.client(), CLIENT_HANDLE_BASE + 2);
}

#[test]
fn vidmem_rounds_up_to_2mib_and_writes_the_size_back() {
    let mut h = Harness::new(&[1 << 30, 1 << 30]);
    let c = h.client();
    let (dev, _) = h.device(c, 1);
    for (form, layout) in [
        (AllocForm::Nvos21, memory_alloc::SIZE_OLD),
        (AllocForm::Nvos21, memory_alloc::SIZE),
        (AllocForm::Nvos64, memory_alloc::SIZE_OLD),
        (AllocForm::Nvos64, memory_alloc::SIZE),
    ] {
        let (handle, s, written) = h.vidmem(form, c, dev, 3 * MIB, layout);
        assert_eq!(s, status::OK, "{form:?} {layout}");
        assert_ne!(handle, 0);
        assert_eq!(written, 4 * MIB, "{form:?} {layout}");
    }
    assert_eq!(h.vidmem(AllocForm::Nvos21, c, dev, 1, 128).2, 2 * MIB);
    assert_eq!(h.vidmem(AllocForm::Nvos21, c, dev, 2 * MIB, 128).2, 2 * MIB);
    assert_eq!(h.rm.used(), vec![0, 20 * MIB]);
    assert_eq!(h.rm.used_by_client()[&c], vec![0, 20 * MIB]);
}

#[test]
fn out_of_memory_charges_nothing_and_leaves_the_size_alone() {
    let mut h = Harness::new(&[64 * MIB]);
    let c = h.client();
    let (dev, _) = h.device(c, 0);
    assert_eq!(h.vidmem(AllocForm::Nvos21, c, dev, 60 * MIB, 128).1, 0);
    let (_, s, written) = h.vidmem(AllocForm::Nvos64, c, dev, 5 * MIB, 120);
    assert_eq!(s, status::NO_MEMORY);
    assert_eq!(written, 5 * MIB, "nothing written back on failure");
    assert_eq!(h.rm.used(), vec![60 * MIB]);
    // Exactly what is left still fits.
    assert_eq!(h.vidmem(AllocForm::Nvos21, c, dev, 4 * MIB, 128).1, 0);
    assert_eq!(h.rm.used(), vec![64 * MIB]);
    // Sizes that overflow when rounded fail the same way.
    assert_eq!(
        h.vidmem(AllocForm::Nvos21, c, dev, u64::MAX, 128).1,
        status::NO_MEMORY
    );
}

#[test]
fn rejects_what_the_driver_rejects() {
    let mut h = Harness::new(&[1 << 30]);
    let c = h.client();
    assert_eq!(h.device(c, 1).1, status::INVALID_ARGUMENT, "no GPU 1");
    assert_eq!(h.device(0x1234, 0).1, status::INVALID_CLIENT);
    let (dev, _) = h.device(c, 0);
    assert_eq!(
        h.vidmem(AllocForm::Nvos21, c, dev, MIB, 100).1,
        status::INVALID_ARGUMENT,
        "params size"
    );
    assert_eq!(
        h.vidmem(AllocForm::Nvos21, c, c, MIB, 128).1,
        status::INVALID_OBJECT_PARENT,
        "memory needs a device"
    );
    assert_eq!(
        h.vidmem(AllocForm::Nvos21, c, 0xbad, MIB, 128).1,
        status::INVALID_OBJECT_PARENT
    );
    assert_eq!(
        h.vidmem(AllocForm::Nvos21, c, dev, 0, 128).1,
        status::INVALID_ARGUMENT
    );
    // A bad pointer to the allocation params.
    assert_eq!(
        h.alloc(
            AllocForm::Nvos21,
            c,
            dev,
            class::MEMORY_LOCAL_USER,
            Some(8),
            128
        )
        .1,
        status::INVALID_ARGUMENT
    );
    assert_eq!(h.rm.used(), vec![0]);
    // Malformed ioctls fail outright.
    let mut short = vec![0u8; 24];
    assert_eq!(
        h.rm.escape(&h.mem, 1, esc::RM_ALLOC, &mut short),
        Err(libc::EINVAL)
    );
    assert_eq!(
        h.rm.escape(&h.mem, 1, esc::RM_FREE, &mut short),
        Err(libc::EINVAL)
    );
}

#[test]
fn caller_chosen_handles_must_be_free() {
    let mut h = Harness::new(&[1 << 30]);
    let c = h.client();
    let p = h.buffer(0u32.to_le_bytes().to_vec());
    let mut params = vec![0u8; 32];
    set_u32(&mut params, nvos21::H_ROOT, c);
    set_u32(&mut params, nvos21::H_OBJECT_PARENT, c);
    set_u32(&mut params, nvos21::H_OBJECT_NEW, 0xd00d);
    set_u32(&mut params, nvos21::H_CLASS, class::DEVICE_0);
    set_u64(&mut params, nvos21::P_ALLOC_PARMS, p);
    let mut again = params.clone();
    h.rm.escape(&h.mem, 1, esc::RM_ALLOC, &mut params).unwrap();
    assert_eq!(u32_at(&params, nvos21::STATUS), status::OK);
    assert_eq!(u32_at(&params, nvos21::H_OBJECT_NEW), 0xd00d);
    h.rm.escape(&h.mem, 1, esc::RM_ALLOC, &mut again).unwrap();
    assert_eq!(
        u32_at(&again, nvos21::STATUS),
        status::INSERT_DUPLICATE_NAME
    );
    // A client asking for a taken client handle.
    let (_, s) = h.alloc(AllocForm::Nvos21, 0, 0, class::ROOT_CLIENT, None, 0);
    assert_eq!(s, status::OK);
    let mut dup = vec![0u8; 32];
    set_u32(&mut dup, nvos21::H_OBJECT_NEW, c);
    set_u32(&mut dup, nvos21::H_CLASS, class::ROOT_CLIENT);
    h.rm.escape(&h.mem, 1, esc::RM_ALLOC, &mut dup).unwrap();
    assert_eq!(u32_at(&dup, nvos21::STATUS), status::INSERT_DUPLICATE_NAME);
}

#[test]
fn frees_cascade_to_children_and_clients_free_everything() {
    let mut h = Harness::new(&[1 << 30, 1 << 30]);
    let c = h.client();
    let (dev0, _) = h.device(c, 0);
    let (dev1, _) = h.device(c, 1);
    let (sub1, s) = h.alloc(AllocForm::Nvos64, c, dev1, class::SUBDEVICE_0, None, 0);
    assert_eq!(s, status::OK);
    let (a, ..) = h.vidmem(AllocForm::Nvos21, c, dev0, 2 * MIB, 128);
    h.vidmem(AllocForm::Nvos21, c, dev0, 4 * MIB, 128);
    h.vidmem(AllocForm::Nvos21, c, sub1, 8 * MIB, 128);
    h.vidmem(AllocForm::Nvos21, c, dev1, 16 * MIB, 128);
    assert_eq!(h.rm.used(), vec![6 * MIB, 24 * MIB]);

    assert_eq!(h.free(c, dev0, a), status::OK);
    assert_eq!(h.free(c, dev0, a), status::INVALID_OBJECT_HANDLE);
    assert_eq!(h.rm.used(), vec![4 * MIB, 24 * MIB]);
    // The device, its subdevice and the memory under both.
    assert_eq!(h.free(c, c, dev1), status::OK);
    assert_eq!(h.rm.used(), vec![4 * MIB, 0]);
    assert_eq!(
        h.vidmem(AllocForm::Nvos21, c, sub1, MIB, 128).1,
        status::INVALID_OBJECT_PARENT,
        "the subdevice went with its device"
    );

    let other = h.client();
    let (dev, _) = h.device(other, 0);
    h.vidmem(AllocForm::Nvos21, other, dev, 10 * MIB, 128);
    assert_eq!(h.free(c, c, c), status::OK);
    assert_eq!(h.free(c, c, c), status::INVALID_CLIENT);
    assert_eq!(h.rm.used(), vec![10 * MIB, 0]);
    assert_eq!(h.rm.clients(), 1);
}

#[test]
fn closing_the_file_frees_its_clients_only() {
    let mut h = Harness::new(&[1 << 30]);
    let mine = h.client();
    let (dev, _) = h.device(mine, 0);
    h.vidmem(AllocForm::Nvos21, mine, dev, 2 * MIB, 128);
    // A client made through another file.
    let mut p = vec![0u8; 32];
    set_u32(&mut p, nvos21::H_CLASS, class::ROOT_CLIENT);
    h.rm.escape(&h.mem, 2, esc::RM_ALLOC, &mut p).unwrap();
    let theirs = u32_at(&p, nvos21::H_OBJECT_NEW);
    let (dev2, _) = h.device(theirs, 0);
    h.vidmem(AllocForm::Nvos21, theirs, dev2, 4 * MIB, 128);
    assert_eq!(h.rm.used(), vec![6 * MIB]);
    h.rm.release(1);
    assert_eq!(h.rm.used(), vec![4 * MIB]);
    assert_eq!(
        h.rm.used_by_client().keys().copied().collect::<Vec<_>>(),
        [theirs]
    );
}

#[test]
fn xfer_unwraps_and_counts_as_the_inner_escape() {
    let mut h = Harness::new(&[1 << 30]);
    let c = h.client();
    let (dev, _) = h.device(c, 0);
    let mut m = vec![0u8; 120];
    set_u64(&mut m, memory_alloc::SIZE_FIELD, 3 * MIB);
    let m_addr = h.buffer(m);
    let mut inner = vec![0u8; nvos64::SIZE as usize];
    set_u32(&mut inner, nvos64::H_ROOT, c);
    set_u32(&mut inner, nvos64::H_OBJECT_PARENT, dev);
    set_u32(&mut inner, nvos64::H_CLASS, class::MEMORY_LOCAL_USER);
    set_u64(&mut inner, nvos64::P_ALLOC_PARMS, m_addr);
    set_u32(&mut inner, nvos64::PARAMS_SIZE, 120);
    let inner_addr = h.buffer(inner);
    let mut outer = vec![0u8; xfer::SIZE as usize];
    set_u32(&mut outer, xfer::CMD, esc::RM_ALLOC);
    set_u32(&mut outer, xfer::PARAMS_SIZE, nvos64::SIZE);
    set_u64(&mut outer, xfer::PTR, inner_addr);
    assert_eq!(
        h.rm.escape(&h.mem, 1, esc::IOCTL_XFER_CMD, &mut outer),
        Ok("rm_alloc")
    );
    let inner = h.mem.get(inner_addr);
    assert_eq!(u32_at(&inner, nvos64::STATUS), status::OK);
    assert_ne!(u32_at(&inner, nvos64::H_OBJECT_NEW), 0);
    assert_eq!(
        u64_at(&h.mem.get(m_addr), memory_alloc::SIZE_FIELD),
        4 * MIB
    );
    assert_eq!(h.rm.used(), vec![4 * MIB]);

    // Nested or oversized transfers are malformed; a bad pointer faults.
    set_u32(&mut outer, xfer::CMD, esc::IOCTL_XFER_CMD);
    assert_eq!(
        h.rm.escape(&h.mem, 1, esc::IOCTL_XFER_CMD, &mut outer),
        Err(libc::EINVAL)
    );
    set_u32(&mut outer, xfer::CMD, esc::RM_ALLOC);
    set_u32(&mut outer, xfer::PARAMS_SIZE, 16385);
    assert_eq!(
        h.rm.escape(&h.mem, 1, esc::IOCTL_XFER_CMD, &mut outer),
        Err(libc::EINVAL)
    );
    set_u32(&mut outer, xfer::PARAMS_SIZE, nvos64::SIZE);
    set_u64(&mut outer, xfer::PTR, 8);
    assert_eq!(
        h.rm.escape(&h.mem, 1, esc::IOCTL_XFER_CMD, &mut outer),
        Err(libc::EFAULT)
    );
}

#[test]
fn control_checks_handles_and_lists_attached_gpus() {
    let mut h = Harness::new(&[1 << 30, 1 << 30]);
    let c = h.client();
    let ids = h.buffer(vec![0u8; 128]);
    let mut p = vec![0u8; nvos54::SIZE as usize];
    set_u32(&mut p, nvos54::H_CLIENT, c);
    set_u32(&mut p, nvos54::H_OBJECT, c);
    set_u32(&mut p, nvos54::CMD, ctrl::GPU_GET_ATTACHED_IDS);
    set_u64(&mut p, nvos54::PARAMS, ids);
    set_u32(&mut p, nvos54::PARAMS_SIZE, 128);
    assert_eq!(
        h.rm.escape(&h.mem, 1, esc::RM_CONTROL, &mut p),
        Ok("rm_control")
    );
    assert_eq!(u32_at(&p, nvos54::STATUS), status::OK);
    let got = h.mem.get(ids);
    assert_eq!(
        [u32_at(&got, 0), u32_at(&got, 4), u32_at(&got, 8)],
        [gpu_id(0), gpu_id(1), ctrl::INVALID_GPU_ID]
    );
    set_u32(&mut p, nvos54::H_OBJECT, 0xbad);
    h.rm.escape(&h.mem, 1, esc::RM_CONTROL, &mut p).unwrap();
    assert_eq!(u32_at(&p, nvos54::STATUS), status::INVALID_OBJECT_HANDLE);
    set_u32(&mut p, nvos54::H_CLIENT, 0xbad);
    h.rm.escape(&h.mem, 1, esc::RM_CONTROL, &mut p).unwrap();
    assert_eq!(u32_at(&p, nvos54::STATUS), status::INVALID_CLIENT);
}

#[test]
fn setup_escapes_succeed() {
    let mut h = Harness::new(&[1 << 30, 2 << 30]);
    let mut cards = vec![0u8; 72 * 4];
    assert_eq!(
        h.rm.escape(&h.mem, 1, esc::CARD_INFO, &mut cards),
        Ok("card_info")
    );
    assert_eq!(cards[72], 1, "second card valid");
    assert_eq!(u64_at(&cards, 72 + card_info::FB_SIZE), 2 << 30);
    assert_eq!(u32_at(&cards, 72 + card_info::MINOR_NUMBER), 1);
    assert_eq!(cards[144], 0, "no third card");
    let mut version = vec![0u8; 72];
    h.rm.escape(&h.mem, 1, esc::CHECK_VERSION_STR, &mut version)
        .unwrap();
    assert_eq!(u32_at(&version, 4), version::REPLY_RECOGNIZED);
    let mut fd = vec![0u8; 4];
    assert_eq!(
        h.rm.escape(&h.mem, 1, esc::REGISTER_FD, &mut fd),
        Ok("register_fd")
    );
    let mut attach = vec![0u8; 8];
    assert_eq!(
        h.rm.escape(&h.mem, 1, esc::ATTACH_GPUS_TO_FD, &mut attach),
        Ok("attach_gpus_to_fd")
    );
    assert_eq!(
        h.rm.escape(&h.mem, 1, esc::CARD_INFO, &mut [0u8; 70]),
        Err(libc::EINVAL)
    );
    // The constants' encodings, as a client would build them.
    assert_eq!(ioctl_cmd(esc::RM_ALLOC, nvos64::SIZE), 0xc030_462b);
}

/// `NVOS02` params for `RM_ALLOC_MEMORY`.
fn nvos02_params(
    client: u32,
    parent: u32,
    handle: u32,
    class: u32,
    flags: u32,
    bytes: u64,
) -> Vec<u8> {
    let mut p = vec![0u8; nvos02::SIZE as usize];
    set_u32(&mut p, nvos02::H_ROOT, client);
    set_u32(&mut p, nvos02::H_OBJECT_PARENT, parent);
    set_u32(&mut p, nvos02::H_OBJECT_NEW, handle);
    set_u32(&mut p, nvos02::H_CLASS, class);
    set_u32(&mut p, nvos02::FLAGS, flags);
    set_u64(&mut p, nvos02::LIMIT, bytes - 1);
    p
}

#[test]
fn alloc_memory_counts_host_memory_and_checks_flags_as_the_driver() {
    let mut h = Harness::new(&[64 * MIB]);
    let client = h.client();
    let (dev, _) = h.device(client, 0);
    let pci_no_map = nvos02::MAPPING_NO_MAP << nvos02::FLAGS_MAPPING_SHIFT;
    let call = |h: &mut Harness, mut p: Vec<u8>| {
        assert_eq!(
            h.rm.escape(&h.mem, 1, esc::RM_ALLOC_MEMORY, &mut p),
            Ok("rm_alloc_memory")
        );
        (u32_at(&p, nvos02::STATUS), u64_at(&p, nvos02::LIMIT))
    };
    let p = nvos02_params(client, dev, 0xd1, class::MEMORY_SYSTEM, pci_no_map, 3 * MIB);
    assert_eq!(call(&mut h, p).0, status::OK);
    assert_eq!(h.rm.sysmem(), 3 * MIB);
    assert_eq!(h.rm.used(), vec![0], "host memory is not video memory");
    // System memory must be in PCI space; an OS descriptor must not be mapped.
    let vid = nvos02::LOCATION_VIDMEM << nvos02::FLAGS_LOCATION_SHIFT;
    let p = nvos02_params(client, dev, 0xd2, class::MEMORY_SYSTEM, vid, MIB);
    assert_eq!(call(&mut h, p).0, status::INVALID_FLAGS);
    let p = nvos02_params(
        client,
        dev,
        0xd2,
        class::MEMORY_SYSTEM_OS_DESCRIPTOR,
        0,
        MIB,
    );
    assert_eq!(call(&mut h, p).0, status::INVALID_FLAGS);
    let p = nvos02_params(
        client,
        dev,
        0xd2,
        class::MEMORY_SYSTEM_OS_DESCRIPTOR,
        pci_no_map,
        MIB,
    );
    assert_eq!(call(&mut h, p).0, status::OK);
    assert_eq!(h.rm.sysmem(), 4 * MIB);
    // A framebuffer view allocates nothing and answers the GPU's size.
    let p = nvos02_params(client, dev, 0xd3, class::MEMORY_LOCAL_USER, vid, 1);
    assert_eq!(call(&mut h, p), (status::OK, 64 * MIB - 1));
    let p = nvos02_params(client, dev, 0xd4, class::DEVICE_0, 0, 1);
    assert_eq!(call(&mut h, p).0, status::INVALID_CLASS);
    assert_eq!(h.rm.used(), vec![0]);
    // Freeing the device frees the host memory under it.
    let mut f = [0u8; nvos00::SIZE as usize];
    set_u32(&mut f, nvos00::H_ROOT, client);
    set_u32(&mut f, nvos00::H_OBJECT_OLD, dev);
    h.rm.escape(&h.mem, 1, esc::RM_FREE, &mut f).unwrap();
    assert_eq!(h.rm.sysmem(), 0);
}

#[test]
fn vid_heap_control_allocates_by_location_and_frees() {
    let mut h = Harness::new(&[64 * MIB]);
    let client = h.client();
    let (dev, _) = h.device(client, 0);
    let heap = |h: &mut Harness, function: u32, attr: u32, flags: u32, bytes: u64, mem: u32| {
        let mut p = vec![0u8; nvos32::SIZE as usize];
        set_u32(&mut p, nvos32::H_ROOT, client);
        set_u32(&mut p, nvos32::H_OBJECT_PARENT, dev);
        set_u32(&mut p, nvos32::FUNCTION, function);
        set_u32(&mut p, nvos32::ALLOC_ATTR, attr);
        set_u32(&mut p, nvos32::ALLOC_FLAGS, flags);
        set_u64(&mut p, nvos32::ALLOC_SIZE, bytes);
        set_u32(&mut p, nvos32::H_MEMORY, mem);
        h.rm.escape(&h.mem, 1, esc::RM_VID_HEAP_CONTROL, &mut p)
            .unwrap();
        (
            u32_at(&p, nvos32::STATUS),
            u32_at(&p, nvos32::H_MEMORY),
            u64_at(&p, nvos32::ALLOC_SIZE),
        )
    };
    let alloc = nvos32::FUNCTION_ALLOC_SIZE;
    let (s, video, size) = heap(&mut h, alloc, 0, 0, 3 * MIB, 0);
    assert_eq!(
        (s, size),
        (status::OK, 4 * MIB),
        "rounded to the page, written back"
    );
    let pci = nvos32::LOCATION_PCI << nvos32::ATTR_LOCATION_SHIFT;
    let provided = nvos32::FLAGS_MEMORY_HANDLE_PROVIDED;
    assert_eq!(heap(&mut h, alloc, pci, provided, MIB, 0xbee).1, 0xbee);
    heap(&mut h, alloc, 0, nvos32::FLAGS_VIRTUAL, 32 * MIB, 0);
    assert_eq!((h.rm.used(), h.rm.sysmem()), (vec![4 * MIB], MIB));
    assert_eq!(heap(&mut h, alloc, 0, 0, 128 * MIB, 0).0, status::NO_MEMORY);
    assert_eq!(
        heap(&mut h, nvos32::FUNCTION_FREE, 0, 0, 0, video).0,
        status::OK
    );
    assert_eq!(
        heap(&mut h, nvos32::FUNCTION_FREE, 0, 0, 0, video).0,
        status::INVALID_OBJECT_HANDLE
    );
    assert_eq!(h.rm.used(), vec![0]);
    assert_eq!(heap(&mut h, 5, 0, 0, 0, 0).0, status::NOT_SUPPORTED);
}

/// A subscription (`AMPERE_SMC_PARTITION_REF`) of `client` under `subdevice` to GPU instance
/// `gi`, presenting descriptor `fd`.
fn subscribe(h: &mut Harness, client: u32, subdevice: u32, gi: u32, fd: u64) -> (u32, u32) {
    let mut p = vec![0u8; smc_partition::SIZE as usize];
    set_u64(&mut p, smc_partition::CAP_DESCRIPTOR, fd);
    set_u32(&mut p, smc_partition::SWIZZ_ID, gi);
    let addr = h.buffer(p);
    h.alloc(
        AllocForm::Nvos64,
        client,
        subdevice,
        class::SMC_PARTITION_REF,
        Some(addr),
        smc_partition::SIZE,
    )
}

#[test]
fn a_gpu_in_mig_mode_charges_each_client_to_the_instance_it_subscribed_to() {
    let instance = |gpu_instance, memory| crate::fake_driver::FakeInstance {
        gpu: 1,
        gpu_instance,
        compute_instances: vec![0],
        memory,
    };
    let (nine, ten) = (instance(9, 16 * MIB), instance(10, 32 * MIB));
    let mut h = Harness::new(&[64 * MIB, 64 * MIB]);
    h.rm = Rm::new(&[64 * MIB, 64 * MIB]).with_instances(&[nine.clone(), ten.clone()]);
    let cap = |i: &crate::fake_driver::FakeInstance| {
        std::path::PathBuf::from(format!(
            "/dev/nvidia-caps/nvidia-cap{}",
            crate::fake_driver::gi_cap_minor(i)
        ))
    };
    h.mem.fds.borrow_mut().insert(5, cap(&nine));
    h.mem.fds.borrow_mut().insert(6, cap(&ten));

    let c = h.client();
    let (dev, _) = h.device(c, 1);
    let (sub, s) = h.alloc(AllocForm::Nvos21, c, dev, class::SUBDEVICE_0, None, 0);
    assert_eq!(s, status::OK);
    // Not subscribed yet: no memory on a GPU in MIG mode.
    let (_, s, _) = h.vidmem(AllocForm::Nvos64, c, dev, 4 * MIB, memory_alloc::SIZE);
    assert_eq!(s, status::INSUFFICIENT_PERMISSIONS);
    // The other instance's capability, an instance that isn't there, a device as parent.
    assert_eq!(
        subscribe(&mut h, c, sub, 9, 6).1,
        status::INSUFFICIENT_PERMISSIONS
    );
    assert_eq!(
        subscribe(&mut h, c, sub, 9, 7).1,
        status::INSUFFICIENT_PERMISSIONS
    );
    assert_eq!(subscribe(&mut h, c, sub, 11, 5).1, status::INVALID_ARGUMENT);
    assert_eq!(
        subscribe(&mut h, c, dev, 9, 5).1,
        status::INVALID_OBJECT_PARENT
    );
    let (partition, s) = subscribe(&mut h, c, sub, 9, 5);
    assert_eq!(s, status::OK);
    assert_eq!(
        subscribe(&mut h, c, sub, 10, 6).1,
        status::INVALID_STATE,
        "one per GPU"
    );

    let (m1, s, _) = h.vidmem(AllocForm::Nvos64, c, dev, 4 * MIB, memory_alloc::SIZE);
    assert_eq!(s, status::OK);
    // Past the instance's 16 MiB, though the GPU has room.
    let (_, s, _) = h.vidmem(AllocForm::Nvos64, c, dev, 14 * MIB, memory_alloc::SIZE);
    assert_eq!(s, status::NO_MEMORY);
    let other = h.client();
    let (dev_d, _) = h.device(other, 1);
    let (sub_d, _) = h.alloc(AllocForm::Nvos21, other, dev_d, class::SUBDEVICE_0, None, 0);
    assert_eq!(subscribe(&mut h, other, sub_d, 10, 6).1, status::OK);
    h.vidmem(AllocForm::Nvos64, other, dev_d, 6 * MIB, memory_alloc::SIZE);
    assert_eq!(
        h.rm.instance_used(),
        BTreeMap::from([((1, 9), 4 * MIB), ((1, 10), 6 * MIB)])
    );
    assert_eq!(h.rm.used(), [0, 10 * MIB]);

    // A compute instance the GPU instance has, and one it doesn't.
    let mut p = vec![0u8; smc_exec_partition::SIZE as usize];
    set_u32(&mut p, smc_exec_partition::EXEC_PARTITION_ID, 0);
    let addr = h.buffer(p.clone());
    let exec = |h: &mut Harness, addr| {
        h.alloc(
            AllocForm::Nvos21,
            c,
            partition,
            class::SMC_EXEC_PARTITION_REF,
            Some(addr),
            smc_exec_partition::SIZE,
        )
        .1
    };
    assert_eq!(exec(&mut h, addr), status::OK);
    set_u32(&mut p, smc_exec_partition::EXEC_PARTITION_ID, 3);
    let addr = h.buffer(p);
    assert_eq!(exec(&mut h, addr), status::INVALID_ARGUMENT);

    // Freed (an object, then a whole client): each instance's ledger goes down with the GPU's.
    assert_eq!(h.free(c, dev, m1), status::OK);
    assert_eq!(h.free(c, sub, partition), status::OK);
    assert_eq!(h.rm.instance_used()[&(1, 9)], 0);
    assert_eq!(h.free(other, other, other), status::OK);
    assert_eq!(h.rm.instance_used()[&(1, 10)], 0);
    assert_eq!(h.rm.used(), [0, 0]);
    // A GPU not in MIG mode takes no subscription.
    let (dev0, _) = h.device(c, 0);
    let (sub0, _) = h.alloc(AllocForm::Nvos21, c, dev0, class::SUBDEVICE_0, None, 0);
    assert_eq!(subscribe(&mut h, c, sub0, 9, 5).1, status::INVALID_STATE);
}
