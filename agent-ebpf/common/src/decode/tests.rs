//! The decoder on byte buffers: fixed cases from the driver's layouts, and arbitrary memory (what
//! a hostile process can pass to `ioctl`), which it must decode without panicking and without
//! pointing its exit outside the parameters the escape declared.
//! `PROPTEST_CASES=100000 cargo test -p gpuwarden-agent-common decode` searches longer.

use std::{vec, vec::Vec};

use proptest::prelude::*;

use super::*;
use crate::nvidia::{ioctl_cmd, ioctl_nr, nvos02, smc_partition};

/// A process's memory: a few buffers at chosen addresses; anything else is unmapped.
#[derive(Debug, Clone, Default)]
struct Memory {
    regions: Vec<(u64, Vec<u8>)>,
}

impl Memory {
    fn put(&mut self, addr: u64, bytes: Vec<u8>) -> u64 {
        self.regions.push((addr, bytes));
        addr
    }
}

impl UserMemory for Memory {
    fn words<const N: usize>(&self, addr: u64) -> Option<[u32; N]> {
        self.regions.iter().find_map(|(base, data)| {
            let start = usize::try_from(addr.checked_sub(*base)?).ok()?;
            le_words(data.get(start..)?)
        })
    }
}

/// A parameter struct of `size` bytes with `fields` (offset, value) set.
fn params(size: u32, fields: &[(usize, u64, usize)]) -> Vec<u8> {
    let mut p = vec![0u8; size as usize];
    for &(at, value, width) in fields {
        p[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
    }
    p
}

const PARAMS: u64 = 0x7f00_0000_1000;
const ALLOC_PARAMS: u64 = 0x7f00_0000_8000;

/// An `RM_ALLOC` of `class` whose allocation params are `alloc_params`.
fn rm_alloc(size: u32, class: u32, alloc_params: &[u8]) -> (Memory, Escape) {
    let params_size_at = if size == nvos64::SIZE {
        nvos64::PARAMS_SIZE
    } else {
        nvos21::PARAMS_SIZE
    };
    let mut mem = Memory::default();
    mem.put(
        PARAMS,
        params(
            size,
            &[
                (nvos21::H_ROOT, 0xc1d0_0001, 4),
                (nvos21::H_OBJECT_PARENT, 0xcaf0_0001, 4),
                (nvos21::H_CLASS, u64::from(class), 4),
                (nvos21::P_ALLOC_PARMS, ALLOC_PARAMS, 8),
                (params_size_at, alloc_params.len() as u64, 4),
            ],
        ),
    );
    mem.put(ALLOC_PARAMS, alloc_params.to_vec());
    let escape = Escape::direct(ioctl_cmd(esc::RM_ALLOC, size), PARAMS);
    (mem, escape)
}

fn memory_params(size: u32, bytes: u64, flags: u32, attr: u32) -> Vec<u8> {
    params(
        size,
        &[
            (memory_alloc::FLAGS, u64::from(flags), 4),
            (memory_alloc::ATTR, u64::from(attr), 4),
            (memory_alloc::SIZE_FIELD, bytes, 8),
        ],
    )
}

#[test]
fn video_memory_is_read_from_every_form_and_layout() {
    for size in [nvos21::SIZE, nvos64::SIZE] {
        for layout in [memory_alloc::SIZE_OLD, memory_alloc::SIZE] {
            let alloc = memory_params(layout, 3 << 20, 0, 0);
            let (mem, escape) = rm_alloc(size, class::MEMORY_LOCAL_USER, &alloc);
            let call = decode(&mem, escape).unwrap().unwrap();
            assert_eq!(call.op, op::VIDMEM, "NVOS size {size}, params {layout}");
            assert_eq!((call.client, call.parent), (0xc1d0_0001, 0xcaf0_0001));
            assert_eq!(call.size(&mem), Some(3 << 20));
            assert_eq!(
                u64::from(call.status_offset),
                if size == nvos21::SIZE { 28 } else { 40 }
            );
        }
    }
}

#[test]
fn host_placement_virtual_ranges_and_other_classes() {
    let pci = memory_alloc::ATTR_LOCATION_PCI << memory_alloc::ATTR_LOCATION_SHIFT;
    let (mem, escape) = rm_alloc(
        nvos21::SIZE,
        class::MEMORY_LOCAL_USER,
        &memory_params(128, 1 << 20, 0, pci),
    );
    assert_eq!(decode(&mem, escape).unwrap().unwrap().op, op::SYSMEM);
    let (mem, escape) = rm_alloc(
        nvos21::SIZE,
        class::MEMORY_SYSTEM,
        &memory_params(128, 1 << 20, 0, 0),
    );
    assert_eq!(decode(&mem, escape).unwrap().unwrap().op, op::SYSMEM);
    let virtual_only = memory_params(128, 1 << 30, memory_alloc::FLAGS_VIRTUAL, 0);
    let (mem, escape) = rm_alloc(nvos64::SIZE, class::MEMORY_LOCAL_USER, &virtual_only);
    assert_eq!(decode(&mem, escape), Ok(None));
    let (mem, escape) = rm_alloc(nvos21::SIZE, 0xc86f, &[]);
    assert_eq!(decode(&mem, escape), Ok(None), "a channel holds no memory");
}

#[test]
fn a_partition_subscription_names_its_gpu_instance() {
    let swizz = |id: u32| {
        params(
            smc_partition::SIZE,
            &[(smc_partition::SWIZZ_ID, u64::from(id), 4)],
        )
    };
    for size in [nvos21::SIZE, nvos64::SIZE] {
        let (mem, escape) = rm_alloc(size, class::SMC_PARTITION_REF, &swizz(9));
        let call = decode(&mem, escape).unwrap().unwrap();
        assert_eq!(
            (call.op, call.value, call.client, call.parent),
            (op::PARTITION, 9, 0xc1d0_0001, 0xcaf0_0001)
        );
        assert_eq!(call.handle_offset, 8);
    }
    let (mem, escape) = rm_alloc(
        nvos21::SIZE,
        class::SMC_PARTITION_REF,
        &swizz(smc_partition::DEVICE_PROFILING_SWIZZID),
    );
    assert_eq!(
        decode(&mem, escape),
        Ok(None),
        "device profiling is no instance"
    );
    // Params that can't be read.
    let (mut mem, escape) = rm_alloc(nvos21::SIZE, class::SMC_PARTITION_REF, &[0; 4]);
    mem.regions.retain(|(base, _)| *base != ALLOC_PARAMS);
    assert_eq!(
        decode(&mem, escape).unwrap_err().reason,
        decode_error::READ_ALLOC_PARAMS
    );
    // The compute-instance subscription creates nothing counted.
    let (mem, escape) = rm_alloc(nvos21::SIZE, class::SMC_EXEC_PARTITION_REF, &[0; 16]);
    assert_eq!(decode(&mem, escape), Ok(None));
}

#[test]
fn malformed_escapes_are_errors_that_say_what() {
    // A params size no layout has.
    let (mem, _) = rm_alloc(nvos21::SIZE, class::MEMORY_LOCAL_USER, &[0; 128]);
    let escape = Escape::direct(ioctl_cmd(esc::RM_ALLOC, 40), PARAMS);
    assert_eq!(
        decode(&mem, escape),
        Err(DecodeError::new(decode_error::BAD_SIZE, esc::RM_ALLOC, 40))
    );
    // Allocation params smaller than the oldest known layout.
    let (mem, escape) = rm_alloc(nvos21::SIZE, class::MEMORY_LOCAL_USER, &[0; 64]);
    let err = decode(&mem, escape).unwrap_err();
    assert_eq!(
        (err.reason, err.detail),
        (decode_error::BAD_SIZE, (32 << 32) | 64)
    );
    // Allocation params that point nowhere.
    let (mut mem, escape) = rm_alloc(nvos21::SIZE, class::DEVICE_0, &[]);
    mem.regions.truncate(1);
    let err = decode(&mem, escape).unwrap_err();
    assert_eq!(err.reason, decode_error::READ_ALLOC_PARAMS);
    // An xfer of the wrong size, and one whose wrapper is unmapped.
    let cmd = ioctl_cmd(esc::IOCTL_XFER_CMD, 8);
    assert_eq!(
        Escape::of(&mem, cmd, PARAMS).unwrap_err().reason,
        decode_error::BAD_SIZE
    );
    let cmd = ioctl_cmd(esc::IOCTL_XFER_CMD, xfer::SIZE);
    assert_eq!(
        Escape::of(&mem, cmd, 0x10).unwrap_err(),
        DecodeError::new(decode_error::READ_PARAMS, esc::IOCTL_XFER_CMD, 0)
    );
}

#[test]
fn alloc_memory_counts_its_limit_plus_one_and_vid_heap_reads_its_function() {
    let mut mem = Memory::default();
    let p = params(
        nvos02::SIZE,
        &[
            (
                nvos02::H_CLASS,
                u64::from(class::MEMORY_SYSTEM_OS_DESCRIPTOR),
                4,
            ),
            (nvos02::LIMIT, (1 << 20) - 1, 8),
        ],
    );
    mem.put(PARAMS, p);
    let escape = Escape::direct(ioctl_cmd(esc::RM_ALLOC_MEMORY, nvos02::SIZE), PARAMS);
    let call = decode(&mem, escape).unwrap().unwrap();
    assert_eq!((call.op, call.size(&mem)), (op::SYSMEM, Some(1 << 20)));

    let vid_heap = |function: u32, attr: u32| {
        let mut mem = Memory::default();
        let fields = [
            (nvos32::FUNCTION, u64::from(function), 4),
            (nvos32::H_MEMORY, 0xbeef, 4),
            (nvos32::ALLOC_ATTR, u64::from(attr), 4),
            (nvos32::ALLOC_SIZE, 5 << 20, 8),
        ];
        mem.put(PARAMS, params(nvos32::SIZE, &fields));
        let escape = Escape::direct(ioctl_cmd(esc::RM_VID_HEAP_CONTROL, nvos32::SIZE), PARAMS);
        decode(&mem, escape).map(|c| c.map(|c| (c.op, c.object, c.size(&mem))))
    };
    let pci = nvos32::LOCATION_PCI << nvos32::ATTR_LOCATION_SHIFT;
    let any = nvos32::LOCATION_ANY << nvos32::ATTR_LOCATION_SHIFT;
    let alloc = nvos32::FUNCTION_ALLOC_SIZE;
    assert_eq!(vid_heap(alloc, 0), Ok(Some((op::VIDMEM, 0, Some(5 << 20)))));
    assert_eq!(
        vid_heap(alloc, any),
        Ok(Some((op::VIDMEM, 0, Some(5 << 20))))
    );
    assert_eq!(
        vid_heap(alloc, pci),
        Ok(Some((op::SYSMEM, 0, Some(5 << 20))))
    );
    let freed = vid_heap(nvos32::FUNCTION_FREE, 0).unwrap().unwrap();
    assert_eq!((freed.0, freed.1), (op::FREE, 0xbeef));
    assert_eq!(vid_heap(9, 0), Ok(None), "other functions allocate nothing");
}

/// Escapes worth aiming at, and sizes worth giving them (each layout's, and its neighbours).
fn escapes() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(esc::RM_ALLOC),
        Just(esc::RM_FREE),
        Just(esc::RM_ALLOC_MEMORY),
        Just(esc::RM_VID_HEAP_CONTROL),
        Just(esc::IOCTL_XFER_CMD),
        any::<u8>().prop_map(u32::from),
    ]
}

fn sizes() -> impl Strategy<Value = u32> {
    let known = [
        nvos00::SIZE,
        nvos02::SIZE,
        nvos21::SIZE,
        nvos32::SIZE,
        nvos64::SIZE,
        xfer::SIZE,
    ];
    prop_oneof![
        proptest::sample::select(known.to_vec()),
        (proptest::sample::select(known.to_vec()), -4i32..=4)
            .prop_map(|(s, d)| s.saturating_add_signed(d)),
        0u32..0x4000,
        any::<u32>(),
    ]
}

/// Addresses: near the buffers, and anywhere (the top of the address space included).
fn addresses() -> impl Strategy<Value = u64> {
    prop_oneof![
        (0u64..4)
            .prop_flat_map(|i| (Just(i), 0u64..256))
            .prop_map(|(i, off)| base(i) + off),
        Just(0),
        (u64::MAX - 256)..=u64::MAX,
        any::<u64>(),
    ]
}

/// The address of buffer `i`.
fn base(i: u64) -> u64 {
    0x7f00_0000_0000 + i * 0x1_0000
}

/// Up to four buffers of arbitrary bytes, sprinkled with pointers into each other (so nested
/// parameters are reached) and with the classes, functions and sizes the decoder tells apart.
fn memories() -> impl Strategy<Value = Memory> {
    let word = prop_oneof![
        any::<u32>(),
        proptest::sample::select(vec![
            class::ROOT_CLIENT,
            class::DEVICE_0,
            class::SUBDEVICE_0,
            class::SMC_PARTITION_REF,
            class::MEMORY_LOCAL_USER,
            class::MEMORY_SYSTEM,
            class::MEMORY_SYSTEM_OS_DESCRIPTOR,
            nvos32::FUNCTION_ALLOC_SIZE,
            nvos32::FUNCTION_FREE,
            memory_alloc::SIZE_OLD,
            memory_alloc::SIZE,
            memory_alloc::FLAGS_VIRTUAL,
        ]),
        // The low half of an address.
        addresses().prop_map(|a| u32::try_from(a & 0xffff_ffff).unwrap_or_default()),
    ];
    let pointer = addresses();
    let buffer =
        proptest::collection::vec((word, pointer, any::<bool>()), 0..64).prop_map(|cells| {
            cells
                .into_iter()
                .flat_map(|(word, pointer, is_pointer)| {
                    if is_pointer {
                        pointer.to_le_bytes().to_vec()
                    } else {
                        word.to_le_bytes().to_vec()
                    }
                })
                .collect::<Vec<u8>>()
        });
    (proptest::collection::vec(buffer, 1..=4), 0usize..4).prop_map(|(buffers, skew)| {
        let mut mem = Memory::default();
        for (i, mut bytes) in buffers.into_iter().enumerate() {
            // Not always 4-byte multiples: a struct may end mid-field at an unmapped page.
            bytes.truncate(bytes.len().saturating_sub(skew));
            mem.put(base(i as u64), bytes);
        }
        mem
    })
}

/// Writes `value`'s low `width` bytes at `at`, where `bytes` is long enough.
fn poke(bytes: &mut [u8], at: usize, value: u64, width: usize) {
    if let Some(field) = bytes.get_mut(at..at + width) {
        field.copy_from_slice(&value.to_le_bytes()[..width]);
    }
}

/// Ioctls aimed at the decoder's branches: an escape at (about) its layout's size, its params
/// struct of random bytes with the fields the decoder tells apart mostly set to values it knows
/// (classes, functions, flags, locations, allocation-params sizes), and a pointer to random
/// allocation params (mostly a valid one, sometimes anything).
fn aimed() -> impl Strategy<Value = (Memory, u32, u64)> {
    let layout = proptest::sample::select(vec![
        (esc::RM_ALLOC, nvos21::SIZE),
        (esc::RM_ALLOC, nvos64::SIZE),
        (esc::RM_FREE, nvos00::SIZE),
        (esc::RM_ALLOC_MEMORY, nvos02::SIZE),
        (esc::RM_VID_HEAP_CONTROL, nvos32::SIZE),
    ]);
    let known =
        |values: Vec<u32>| prop_oneof![4 => proptest::sample::select(values), 1 => any::<u32>()];
    let class = known(vec![
        class::ROOT_CLIENT,
        class::DEVICE_0,
        class::SUBDEVICE_0,
        class::SMC_PARTITION_REF,
        class::MEMORY_LOCAL_USER,
        class::MEMORY_SYSTEM,
        class::MEMORY_SYSTEM_OS_DESCRIPTOR,
    ]);
    let params_size = known(vec![0, memory_alloc::SIZE_OLD, memory_alloc::SIZE, 64]);
    let function = known(vec![nvos32::FUNCTION_ALLOC_SIZE, nvos32::FUNCTION_FREE]);
    let flags = known(vec![0, memory_alloc::FLAGS_VIRTUAL]);
    let location = known(vec![0, 1, 2, 3]);
    let pointer = prop_oneof![4 => (0u64..8).prop_map(|off| base(1) + off), 1 => addresses()];
    (
        (layout, -8i32..=4, 0usize..=160),
        (
            proptest::collection::vec(any::<u8>(), 192),
            proptest::collection::vec(any::<u8>(), 160),
        ),
        (class, params_size, function, flags, location, pointer),
    )
        .prop_map(
            |((layout, slack, alloc_len), (mut head, mut alloc), fields)| {
                let (nr, size) = layout;
                let (class, params_size, function, flags, location, pointer) = fields;
                let attr = location << memory_alloc::ATTR_LOCATION_SHIFT;
                head.truncate(usize::try_from(size.saturating_add_signed(slack)).unwrap_or(0));
                alloc.truncate(alloc_len);
                match (nr, size) {
                    (esc::RM_ALLOC, _) => {
                        poke(&mut head, nvos21::H_CLASS, u64::from(class), 4);
                        poke(&mut head, nvos21::P_ALLOC_PARMS, pointer, 8);
                        let at = if size == nvos21::SIZE {
                            nvos21::PARAMS_SIZE
                        } else {
                            nvos64::PARAMS_SIZE
                        };
                        poke(&mut head, at, u64::from(params_size), 4);
                        poke(&mut alloc, memory_alloc::FLAGS, u64::from(flags), 4);
                        poke(&mut alloc, memory_alloc::ATTR, u64::from(attr), 4);
                    }
                    (esc::RM_ALLOC_MEMORY, _) => {
                        poke(&mut head, nvos02::H_CLASS, u64::from(class), 4);
                    }
                    (esc::RM_VID_HEAP_CONTROL, _) => {
                        poke(&mut head, nvos32::FUNCTION, u64::from(function), 4);
                        poke(&mut head, nvos32::ALLOC_FLAGS, u64::from(flags), 4);
                        let attr = location << nvos32::ATTR_LOCATION_SHIFT;
                        poke(&mut head, nvos32::ALLOC_ATTR, u64::from(attr), 4);
                    }
                    _ => {}
                }
                let mut mem = Memory::default();
                let params = mem.put(base(0), head);
                mem.put(base(1), alloc);
                (mem, ioctl_cmd(nr, size), params)
            },
        )
}

/// Anything at all: arbitrary memory, escape, size and address.
fn unaimed() -> impl Strategy<Value = (Memory, u32, u64)> {
    (memories(), escapes(), sizes(), addresses())
        .prop_map(|(mem, nr, size, params)| (mem, ioctl_cmd(nr, size), params))
}

/// Whether the decoder may read `len` bytes at `addr` inside the `size` bytes at `params`.
fn inside(params: u64, size: u32, addr: u64, len: u64) -> bool {
    addr.checked_sub(params)
        .and_then(|off| off.checked_add(len))
        .is_some_and(|end| end <= u64::from(size))
}

proptest! {
    /// Whatever a process passes, the decoder answers without panicking, and a call it records
    /// reads the driver's answer only inside the parameter struct the escape declared (or, for
    /// `RM_ALLOC` memory, the size field of the allocation params it pointed to).
    #[test]
    fn arbitrary_ioctls_decode_within_their_params(
        (mem, cmd, params) in prop_oneof![aimed(), unaimed()],
    ) {
        let nr = ioctl_nr(cmd);
        let escape = match Escape::of(&mem, cmd, params) {
            Ok(escape) => escape,
            Err(err) => {
                prop_assert_eq!(err.escape, esc::IOCTL_XFER_CMD);
                Escape::direct(cmd, params)
            }
        };
        if nr != esc::IOCTL_XFER_CMD {
            prop_assert_eq!(escape, Escape::direct(cmd, params));
        }
        let Ok(Some(call)) = decode(&mem, escape) else {
            return Ok(());
        };
        prop_assert_eq!(call.params, escape.params);
        prop_assert!(inside(call.params, escape.size, call.params.wrapping_add(u64::from(call.status_offset)), 4));
        if call.op != op::FREE {
            prop_assert!(inside(call.params, escape.size, call.params.wrapping_add(u64::from(call.handle_offset)), 4));
        }
        match call.op {
            op::VIDMEM | op::SYSMEM if escape.nr == esc::RM_ALLOC => {
                let alloc_params = mem.u64_at(params.wrapping_add(nvos21::P_ALLOC_PARMS as u64));
                prop_assert_eq!(Some(call.size_at), alloc_params.map(|a| a.wrapping_add(memory_alloc::SIZE_FIELD as u64)));
            }
            op::VIDMEM | op::SYSMEM => prop_assert!(inside(call.params, escape.size, call.size_at, 8)),
            op::CLIENT | op::DEVICE | op::SUBDEVICE | op::FREE | op::PARTITION => {}
            other => prop_assert!(false, "unknown op {}", other),
        }
        // What the exit reads never panics either.
        let _ = (call.status(&mem), call.new_handle(&mem), call.size(&mem));
    }

    /// An escape wrapped in `IOCTL_XFER_CMD` decodes exactly as the same escape issued directly.
    #[test]
    fn xfer_decodes_like_the_escape_it_carries(
        mut mem in memories(),
        nr in escapes(),
        size in sizes(),
        params in addresses(),
    ) {
        let direct = Escape { nr, size, params };
        let mut wrapper = Vec::with_capacity(16);
        wrapper.extend_from_slice(&nr.to_le_bytes());
        wrapper.extend_from_slice(&size.to_le_bytes());
        wrapper.extend_from_slice(&params.to_le_bytes());
        let at = mem.put(0x10_0000, wrapper);
        let cmd = ioctl_cmd(esc::IOCTL_XFER_CMD, xfer::SIZE);
        let carried = Escape::of(&mem, cmd, at);
        prop_assert_eq!(carried, Ok(direct));
        prop_assert_eq!(decode(&mem, direct), decode(&mem, carried.unwrap_or(direct)));
    }
}
