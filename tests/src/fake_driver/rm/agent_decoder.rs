//! The agent's ioctl decoder (`gpuwarden_agent_common::decode`, the code its eBPF program runs)
//! played against this fake driver on arbitrary sequences of escapes, corrupted ones included.
//!
//! Each escape is decoded at enter from the caller's memory, answered by the driver, and, when
//! the ioctl and its `status` succeeded, read back and booked at exit the way the agent books it
//! (a device's GPU from its `deviceId`, memory charged to its parent's GPU or to the host, frees
//! cascading under devices and clients). After every escape the account must equal what the
//! driver holds, GPU by GPU and on the host: an escape the driver charges and the decoder misses,
//! or one the decoder charges and the driver refuses, fails the test.
//! `PROPTEST_CASES=10000 cargo test -p gpuwarden-tests --lib agent_decoder` searches longer.
//!
//! Not played here, because this fake doesn't model them: `NV01_MEMORY_LOCAL_USER` placed in host
//! memory through `attr` (decoded as host memory; see the decoder's own tests), and the agent's
//! ways of finding a GPU for memory whose device handle it never saw (a late agent; the
//! `agent_accounting` tests).

use std::collections::{BTreeMap, BTreeSet};

use gpuwarden_agent_common::decode::{self, Call, Escape, UserMemory, op};
use proptest::prelude::*;

use super::{tests::FakeMemory, *};
use crate::{
    abi::nvidia::{ioctl_cmd, ioctl_nr, ioctl_size},
    fake_driver::caller::CallerMemory,
};

const MIB: u64 = 1 << 20;
const GPU_MEMORY: [u64; 2] = [256 * MIB, 512 * MIB];

impl UserMemory for FakeMemory {
    fn words<const N: usize>(&self, addr: u64) -> Option<[u32; N]> {
        decode::le_words(&self.read(addr, 4 * N).ok()?)
    }
}

/// What the agent books for an object it saw created.
#[derive(Debug, Clone, Copy)]
enum Booked {
    /// A device or subdevice on a GPU (`None`: one the agent couldn't place).
    Device(Option<u32>),
    /// Memory on a GPU or on the host.
    Memory {
        gpu: Option<u32>,
        host: bool,
        bytes: u64,
    },
}

/// The agent's account, kept as its exit handlers keep it.
#[derive(Debug, Default)]
struct Account {
    /// (client, handle) → (parent, what).
    objects: BTreeMap<(u32, u32), (u32, Booked)>,
    clients: BTreeSet<u32>,
}

impl Account {
    fn gpu_of(&self, client: u32, object: u32) -> Option<u32> {
        match self.objects.get(&(client, object)) {
            Some((_, Booked::Device(gpu))) => *gpu,
            _ => None,
        }
    }

    /// Books what a call that succeeded did.
    fn exit(&mut self, call: &Call, mem: &FakeMemory) {
        let handle = call.new_handle(mem);
        let (client, parent) = (call.client, call.parent);
        match (call.op, handle) {
            (op::CLIENT, Some(h)) => {
                self.clients.insert(h);
            }
            (op::DEVICE, Some(h)) => {
                let what = Booked::Device(Some(call.value));
                self.objects.insert((client, h), (parent, what));
            }
            (op::SUBDEVICE, Some(h)) => {
                let what = Booked::Device(self.gpu_of(client, parent));
                self.objects.insert((client, h), (parent, what));
            }
            (op::VIDMEM | op::SYSMEM, Some(h)) => {
                let host = call.op == op::SYSMEM;
                let gpu = if host {
                    None
                } else {
                    self.gpu_of(client, parent)
                };
                let bytes = call.size(mem).unwrap_or(0);
                let what = Booked::Memory { gpu, host, bytes };
                self.objects.insert((client, h), (parent, what));
            }
            (op::FREE, _) => self.free(client, call.object),
            _ => {}
        }
    }

    /// A free: of the client and all it holds, or of an object and everything under it.
    fn free(&mut self, client: u32, object: u32) {
        if object == client {
            self.clients.remove(&client);
            self.objects.retain(|(c, _), _| *c != client);
            return;
        }
        let mut doomed = BTreeSet::from([object]);
        loop {
            let before = doomed.len();
            for ((c, h), (parent, _)) in &self.objects {
                if *c == client && doomed.contains(parent) {
                    doomed.insert(*h);
                }
            }
            if doomed.len() == before {
                break;
            }
        }
        self.objects
            .retain(|(c, h), _| *c != client || !doomed.contains(h));
    }

    /// Video memory booked per GPU, and host memory.
    fn held(&self) -> (Vec<u64>, u64) {
        let mut video = vec![0; GPU_MEMORY.len()];
        let mut host = 0;
        for (_, what) in self.objects.values() {
            match *what {
                Booked::Memory {
                    host: true, bytes, ..
                } => host += bytes,
                Booked::Memory { gpu, bytes, .. } => {
                    let slot = gpu.and_then(|g| video.get_mut(g as usize));
                    *slot.expect("video memory booked on a GPU that doesn't exist") += bytes;
                }
                Booked::Device(_) => {}
            }
        }
        (video, host)
    }

    /// The handles worth aiming at: clients, and each client's objects.
    fn clients(&self) -> Vec<u32> {
        self.clients.iter().copied().collect()
    }

    fn objects_of(&self, client: u32) -> Vec<u32> {
        self.objects
            .keys()
            .filter(|(c, _)| *c == client)
            .map(|(_, h)| *h)
            .collect()
    }
}

/// One escape a CUDA-like process might issue, with handles chosen by index among those alive
/// (an index past them picks a handle nobody holds).
#[derive(Debug, Clone)]
enum Intent {
    Client,
    Device {
        client: u8,
        id: u32,
    },
    Subdevice {
        client: u8,
        parent: u8,
    },
    /// `RM_ALLOC` of a memory class.
    Memory {
        client: u8,
        parent: u8,
        class: u32,
        bytes: u64,
        nvos64: bool,
        layout: u32,
        xfer: bool,
    },
    /// `RM_ALLOC_MEMORY`.
    AllocMemory {
        client: u8,
        parent: u8,
        class: u32,
        flags: u32,
        bytes: u64,
    },
    /// `RM_VID_HEAP_CONTROL` `ALLOC_SIZE`.
    VidHeap {
        client: u8,
        parent: u8,
        bytes: u64,
        location: u32,
        virtual_only: bool,
    },
    /// `RM_FREE` (or `RM_VID_HEAP_CONTROL` `FREE`) of an object, or of the client itself.
    Free {
        client: u8,
        object: Option<u8>,
        vid_heap: bool,
        xfer: bool,
    },
    /// Any escape, any size, any bytes.
    Raw {
        nr: u32,
        bytes: Vec<u8>,
    },
}

fn sizes() -> impl Strategy<Value = u64> {
    prop_oneof![
        (1u64..=64).prop_map(|n| n * MIB / 2),
        1u64..=MIB,
        Just(0),
        (u64::MAX - 4 * MIB)..=u64::MAX,
        any::<u64>(),
    ]
}

fn intents() -> impl Strategy<Value = Intent> {
    let pick = any::<u8>;
    prop_oneof![
        2 => Just(Intent::Client),
        2 => (pick(), 0u32..3).prop_map(|(client, id)| Intent::Device { client, id }),
        1 => (pick(), pick()).prop_map(|(client, parent)| Intent::Subdevice { client, parent }),
        6 => (
            (pick(), pick()),
            proptest::sample::select(vec![
                class::MEMORY_LOCAL_USER,
                class::MEMORY_SYSTEM,
                class::NV50_MEMORY_VIRTUAL,
            ]),
            sizes(),
            any::<bool>(),
            proptest::sample::select(vec![memory_alloc::SIZE_OLD, memory_alloc::SIZE, 0, 64, 200]),
            any::<bool>(),
        )
            .prop_map(|((client, parent), class, bytes, nvos64, layout, xfer)| Intent::Memory {
                client,
                parent,
                class,
                bytes,
                nvos64,
                layout,
                xfer,
            }),
        2 => (
            (pick(), pick()),
            proptest::sample::select(vec![
                class::MEMORY_SYSTEM,
                class::MEMORY_SYSTEM_OS_DESCRIPTOR,
                class::MEMORY_LOCAL_USER,
            ]),
            prop_oneof![
                Just(0),
                Just(nvos02::MAPPING_NO_MAP << nvos02::FLAGS_MAPPING_SHIFT),
                any::<u32>(),
            ],
            sizes(),
        )
            .prop_map(|((client, parent), class, flags, bytes)| Intent::AllocMemory {
                client,
                parent,
                class,
                flags,
                bytes,
            }),
        3 => ((pick(), pick()), sizes(), 0u32..4, proptest::bool::weighted(0.2)).prop_map(
            |((client, parent), bytes, location, virtual_only)| Intent::VidHeap {
                client,
                parent,
                bytes,
                location,
                virtual_only,
            }
        ),
        4 => (pick(), proptest::option::weighted(0.8, pick()), any::<bool>(), any::<bool>())
            .prop_map(|(client, object, vid_heap, xfer)| Intent::Free {
                client,
                object,
                vid_heap,
                xfer,
            }),
        1 => (
            proptest::sample::select(vec![
                esc::RM_ALLOC,
                esc::RM_FREE,
                esc::RM_ALLOC_MEMORY,
                esc::RM_VID_HEAP_CONTROL,
            ]),
            proptest::collection::vec(any::<u8>(), 0..=200),
        )
            .prop_map(|(nr, bytes)| Intent::Raw { nr, bytes }),
    ]
}

/// A process, the driver it talks to, and the agent's account of it.
struct Run {
    rm: Rm,
    mem: FakeMemory,
    account: Account,
    next_addr: u64,
}

impl Run {
    fn new() -> Self {
        Self {
            rm: Rm::new(&GPU_MEMORY),
            mem: FakeMemory::default(),
            account: Account::default(),
            next_addr: 0x7f00_0000_0000,
        }
    }

    fn buffer(&mut self, data: Vec<u8>) -> u64 {
        self.next_addr += 0x1_0000;
        self.mem.put(self.next_addr, data)
    }

    /// The client at `index` among those alive, or one nobody holds.
    fn client(&self, index: u8) -> u32 {
        let clients = self.account.clients();
        clients
            .get(usize::from(index) % (clients.len() + 1))
            .copied()
            .unwrap_or(0x0bad_c11e)
    }

    /// The object at `index` among `client`'s, the client itself, or one nobody holds.
    fn object(&self, client: u32, index: u8) -> u32 {
        let mut objects = self.account.objects_of(client);
        objects.push(client);
        objects
            .get(usize::from(index) % (objects.len() + 1))
            .copied()
            .unwrap_or(0x0bad_0b1e)
    }

    /// The parameter struct of `intent` (and what it points to), the escape, and whether it
    /// travels through `IOCTL_XFER_CMD`.
    #[expect(clippy::too_many_lines, reason = "one arm per ioctl the decoder knows")]
    fn build(&mut self, intent: &Intent) -> (u32, Vec<u8>, bool) {
        match *intent {
            Intent::Client => (
                esc::RM_ALLOC,
                Self::rm_alloc(0, 0, class::ROOT_CLIENT, None),
                false,
            ),
            Intent::Device { client, id } => {
                let client = self.client(client);
                let params = self.buffer(id.to_le_bytes().repeat(14));
                let p = Self::rm_alloc(client, client, class::DEVICE_0, Some((params, 56, false)));
                (esc::RM_ALLOC, p, false)
            }
            Intent::Subdevice { client, parent } => {
                let client = self.client(client);
                let parent = self.object(client, parent);
                let params = self.buffer(vec![0; 4]);
                let p =
                    Self::rm_alloc(client, parent, class::SUBDEVICE_0, Some((params, 4, false)));
                (esc::RM_ALLOC, p, false)
            }
            Intent::Memory {
                client,
                parent,
                class,
                bytes,
                nvos64,
                layout,
                xfer,
            } => {
                let client = self.client(client);
                let parent = self.object(client, parent);
                let mut m = vec![0u8; memory_alloc::SIZE as usize];
                if class == class::NV50_MEMORY_VIRTUAL {
                    set_u32(&mut m, memory_alloc::FLAGS, memory_alloc::FLAGS_VIRTUAL);
                }
                set_u64(&mut m, memory_alloc::SIZE_FIELD, bytes);
                let params = self.buffer(m);
                let p = Self::rm_alloc(client, parent, class, Some((params, layout, nvos64)));
                (esc::RM_ALLOC, p, xfer)
            }
            Intent::AllocMemory {
                client,
                parent,
                class,
                flags,
                bytes,
            } => {
                let client = self.client(client);
                let parent = self.object(client, parent);
                let mut p = vec![0u8; nvos02::SIZE as usize];
                set_u32(&mut p, nvos02::H_ROOT, client);
                set_u32(&mut p, nvos02::H_OBJECT_PARENT, parent);
                set_u32(&mut p, nvos02::H_CLASS, class);
                set_u32(&mut p, nvos02::FLAGS, flags);
                set_u64(&mut p, nvos02::LIMIT, bytes.wrapping_sub(1));
                (esc::RM_ALLOC_MEMORY, p, false)
            }
            Intent::VidHeap {
                client,
                parent,
                bytes,
                location,
                virtual_only,
            } => {
                let client = self.client(client);
                let parent = self.object(client, parent);
                let mut p = vec![0u8; nvos32::SIZE as usize];
                set_u32(&mut p, nvos32::H_ROOT, client);
                set_u32(&mut p, nvos32::H_OBJECT_PARENT, parent);
                set_u32(&mut p, nvos32::FUNCTION, nvos32::FUNCTION_ALLOC_SIZE);
                let attr = location << nvos32::ATTR_LOCATION_SHIFT;
                set_u32(&mut p, nvos32::ALLOC_ATTR, attr);
                if virtual_only {
                    set_u32(&mut p, nvos32::ALLOC_FLAGS, nvos32::FLAGS_VIRTUAL);
                }
                set_u64(&mut p, nvos32::ALLOC_SIZE, bytes);
                (esc::RM_VID_HEAP_CONTROL, p, false)
            }
            Intent::Free {
                client,
                object,
                vid_heap,
                xfer,
            } => {
                let client = self.client(client);
                let object = object.map_or(client, |o| self.object(client, o));
                if vid_heap {
                    let mut p = vec![0u8; nvos32::SIZE as usize];
                    set_u32(&mut p, nvos32::H_ROOT, client);
                    set_u32(&mut p, nvos32::FUNCTION, nvos32::FUNCTION_FREE);
                    set_u32(&mut p, nvos32::H_MEMORY, object);
                    (esc::RM_VID_HEAP_CONTROL, p, xfer)
                } else {
                    let mut p = vec![0u8; nvos00::SIZE as usize];
                    set_u32(&mut p, nvos00::H_ROOT, client);
                    set_u32(&mut p, nvos00::H_OBJECT_OLD, object);
                    (esc::RM_FREE, p, xfer)
                }
            }
            Intent::Raw { nr, ref bytes } => (nr, bytes.clone(), false),
        }
    }

    /// An `RM_ALLOC` struct; `alloc` is (params address, paramsSize, NVOS64).
    fn rm_alloc(client: u32, parent: u32, class: u32, alloc: Option<(u64, u32, bool)>) -> Vec<u8> {
        let (addr, params_size, nvos64) = alloc.unwrap_or((0, 0, false));
        let (size, params_size_at) = if nvos64 {
            (nvos64::SIZE, nvos64::PARAMS_SIZE)
        } else {
            (nvos21::SIZE, nvos21::PARAMS_SIZE)
        };
        let mut p = vec![0u8; size as usize];
        set_u32(&mut p, nvos21::H_ROOT, client);
        set_u32(&mut p, nvos21::H_OBJECT_PARENT, parent);
        set_u32(&mut p, nvos21::H_CLASS, class);
        set_u64(&mut p, nvos21::P_ALLOC_PARMS, addr);
        set_u32(&mut p, params_size_at, params_size);
        p
    }

    /// Issues escape `nr` with `params` (directly or through `IOCTL_XFER_CMD`) as the agent
    /// sees it: decoded at enter, answered by the driver, booked at exit if it succeeded.
    fn issue(&mut self, nr: u32, params: Vec<u8>, xfer: bool) {
        let size = u32::try_from(params.len()).unwrap_or(u32::MAX);
        let at = self.buffer(params);
        let (cmd, arg) = if xfer {
            let mut wrapper = vec![0u8; xfer::SIZE as usize];
            set_u32(&mut wrapper, xfer::CMD, nr);
            set_u32(&mut wrapper, xfer::PARAMS_SIZE, size);
            set_u64(&mut wrapper, xfer::PTR, at);
            (
                ioctl_cmd(esc::IOCTL_XFER_CMD, xfer::SIZE),
                self.buffer(wrapper),
            )
        } else {
            (ioctl_cmd(nr, size), at)
        };
        // Enter.
        let escape = Escape::of(&self.mem, cmd, arg).unwrap_or(Escape::direct(cmd, arg));
        let call = decode::decode(&self.mem, escape).ok().flatten();
        // The driver. FUSE copies an `_IOC` struct in, and out when the ioctl succeeds.
        let Ok(mut copied) = self.mem.read(arg, ioctl_size(cmd) as usize) else {
            return;
        };
        let answered = self.rm.escape(&self.mem, 1, ioctl_nr(cmd), &mut copied);
        if answered.is_ok() {
            self.mem
                .write(arg, &copied)
                .expect("the struct was just read");
        }
        // Exit.
        if let (Ok(_), Some(call)) = (answered, call)
            && call.status(&self.mem) == Some(status::OK)
        {
            self.account.exit(&call, &self.mem);
        }
    }
}

proptest! {
    /// Escape by escape, the agent's account equals the driver's ledger.
    #[test]
    fn the_decoders_account_matches_the_driver(
        steps in proptest::collection::vec(
            (intents(), proptest::option::weighted(0.15, (any::<prop::sample::Index>(), any::<u8>()))),
            1..40,
        ),
    ) {
        let mut run = Run::new();
        for (i, (intent, corruption)) in steps.iter().enumerate() {
            let (nr, mut params, xfer) = run.build(intent);
            if let Some((at, flip)) = corruption
                && !params.is_empty()
            {
                let at = at.index(params.len());
                params[at] ^= flip;
            }
            run.issue(nr, params, xfer);
            let (video, host) = run.account.held();
            prop_assert_eq!(&video, &run.rm.used(), "video memory after step {}: {:?}", i, intent);
            prop_assert_eq!(host, run.rm.sysmem(), "host memory after step {}: {:?}", i, intent);
        }
    }
}
