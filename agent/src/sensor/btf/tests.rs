use super::*;

/// Builds BTF: `struct outer { int a; union { int b; long c; }; int d; }` and `struct other`.
fn sample() -> Vec<u8> {
    let strings = b"\0int\0outer\0a\0b\0c\0d\0other\0x\0";
    let name = |s: &str| -> u32 {
        let hay = std::str::from_utf8(strings).unwrap();
        u32::try_from(hay.find(&format!("\0{s}\0")).unwrap() + 1).unwrap()
    };
    let mut types = Vec::new();
    let mut put = |words: &[u32]| {
        for w in words {
            types.extend_from_slice(&w.to_le_bytes());
        }
    };
    // 1: int (4 bytes), with its extra word.
    put(&[name("int"), kind::INT << 24, 4, 32]);
    // 2: union { int b @0; int c @0 } (anonymous)
    put(&[
        0,
        (kind::UNION << 24) | 2,
        8,
        name("b"),
        1,
        0,
        name("c"),
        1,
        0,
    ]);
    // 3: struct outer { a @0; <union> @64; d @128 }
    put(&[
        name("outer"),
        (kind::STRUCT << 24) | 3,
        24,
        name("a"),
        1,
        0,
        0,
        2,
        64,
        name("d"),
        1,
        128,
    ]);
    // 4: struct other, with kind_flag (bitfield sizes in the top byte): x @ bit 0x28 (40), 3 bits.
    put(&[
        name("other"),
        (1 << 31) | (kind::STRUCT << 24) | 1,
        8,
        name("x"),
        1,
        (3 << 24) | 0x28,
    ]);
    let mut data = Vec::new();
    data.extend_from_slice(&MAGIC.to_le_bytes());
    data.extend_from_slice(&[1, 0]);
    let header = [
        24u32,
        0,
        u32::try_from(types.len()).unwrap(),
        u32::try_from(types.len()).unwrap(),
    ];
    for w in header {
        data.extend_from_slice(&w.to_le_bytes());
    }
    data.extend_from_slice(&u32::try_from(strings.len()).unwrap().to_le_bytes());
    data.extend_from_slice(&types);
    data.extend_from_slice(strings);
    data
}

#[test]
fn finds_members_also_inside_anonymous_unions() {
    let btf = Btf::parse(&sample()).unwrap();
    assert_eq!(btf.member_offset("outer", "a").unwrap(), 0);
    assert_eq!(btf.member_offset("outer", "b").unwrap(), 8);
    assert_eq!(btf.member_offset("outer", "c").unwrap(), 8);
    assert_eq!(btf.member_offset("outer", "d").unwrap(), 16);
    assert_eq!(
        btf.member_offset("other", "x").unwrap(),
        5,
        "bitfield size masked off"
    );
    assert!(matches!(
        btf.member_offset("outer", "e"),
        Err(BtfError::Missing(m)) if m == "outer.e"
    ));
    assert!(btf.member_offset("nope", "a").is_err());
}

#[test]
fn refuses_what_is_not_btf() {
    assert!(matches!(
        Btf::parse(b"\x7fELF"),
        Err(BtfError::Malformed(_))
    ));
    let mut cut = sample();
    cut.truncate(40);
    assert!(Btf::parse(&cut).is_err());
}

/// On a kernel with BTF (the dev and CI kernels have it), the offsets the programs need are all
/// there and distinct where the structs are the same. A kernel without BTF fails the test rather
/// than skipping it: the agent itself needs the file there.
#[test]
fn the_running_kernel_has_the_file_offsets() {
    let path = Path::new("/sys/kernel/btf/vmlinux");
    assert!(
        path.exists(),
        "{} is missing: the agent reads the kernel's BTF for its file offsets, and the dev and CI \
         kernels have it (a kernel built without CONFIG_DEBUG_INFO_BTF cannot run the agent)",
        path.display()
    );
    let offsets = Btf::from_path(path).unwrap().file_offsets().unwrap();
    assert_eq!(offsets.valid, 1);
    assert_ne!(offsets.fdt_max_fds, offsets.fdt_fd);
    assert_ne!(offsets.inode_rdev, offsets.inode_ino);
    assert!(offsets.task_files > 0 && offsets.task_files < 16 << 10);
    assert_ne!(
        offsets.file_refs_kind,
        gpuwarden_agent_common::config::file_refs::ABSENT,
        "the open file's reference count (f_ref or f_count) is found"
    );
    assert_ne!(offsets.file_refs, offsets.file_inode);
}
