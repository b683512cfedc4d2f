//! The typed walk from a task to the file behind an fd (`agent-ebpf/src/btf_walk.rs`): direct
//! loads the verifier types from the kernel's BTF instead of a `bpf_probe_read_kernel` call per
//! hop, what every ioctl on the node pays.
//!
//! The programs call the `bpf_rdonly_cast` kfunc through a raw instruction with a placeholder
//! id ([`kfunc`]); [`patch`] writes the kernel's id over it, or, where the walk is off, an
//! instruction that does nothing (the call is then on a path the settings turn off, but the
//! verifier resolves every call before it prunes). [`verifies`] loads a few instructions that
//! make the same walk, so a kernel that refuses any part of it (the helper, the typed loads at
//! these offsets, the kfunc) turns the walk off rather than failing the programs' load.

use gpuwarden_agent_common::config::{FileOffsets, kfunc};

use super::btf::TypedWalk;

/// `object` with each placeholder kfunc call made a call to `rdonly_cast` (its BTF id), or,
/// with `None`, `r0 = 0`. Returns the patched copy and how many calls it patched.
#[must_use]
pub fn patch(object: &[u8], rdonly_cast: Option<u32>) -> (Vec<u8>, usize) {
    let placeholder = kfunc::call(kfunc::RDONLY_CAST_PLACEHOLDER).to_le_bytes();
    let with = rdonly_cast
        .map_or(kfunc::ZERO_R0, kfunc::call)
        .to_le_bytes();
    let mut out = object.to_vec();
    let mut patched = 0;
    // Instructions are 8-byte aligned within their section, and sections within the file.
    for insn in out.chunks_exact_mut(8) {
        if insn == placeholder {
            insn.copy_from_slice(&with);
            patched += 1;
        }
    }
    (out, patched)
}

/// The opcodes and ids the probe uses.
mod op {
    pub const LDX_DW: u8 = 0x79;
    pub const LDX_W: u8 = 0x61;
    pub const ADD_K: u8 = 0x07;
    pub const MOV_K: u8 = 0xb7;
    pub const CALL: u8 = 0x85;
    pub const EXIT: u8 = 0x95;
    /// The helper `bpf_get_current_task_btf`.
    pub const GET_CURRENT_TASK_BTF: i32 = 158;
    /// `src_reg` of a kfunc call (`BPF_PSEUDO_KFUNC_CALL`).
    pub const KFUNC_CALL: u8 = 2;
}

/// Encodes one instruction: opcode, dst and src registers, offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | (u64::from(dst & 0xf) << 8)
        | (u64::from(src & 0xf) << 12)
        | (u64::from(off.cast_unsigned()) << 16)
        | (u64::from(imm.cast_unsigned()) << 32)
}

/// The instructions of the probe: the walk of `btf_walk::file_of_fd` and `inode_of` for fd 0,
/// as the programs make it.
fn probe_program(o: &FileOffsets, walk: TypedWalk) -> Vec<u64> {
    use op::{ADD_K, CALL, EXIT, GET_CURRENT_TASK_BTF, KFUNC_CALL, LDX_DW, LDX_W, MOV_K};
    let imm = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
    vec![
        insn(CALL, 0, 0, 0, GET_CURRENT_TASK_BTF),
        // r1 = task->files; r1 = files->fdt
        insn(ADD_K, 0, 0, 0, imm(o.task_files)),
        insn(LDX_DW, 1, 0, 0, 0),
        insn(ADD_K, 1, 0, 0, imm(o.files_fdt)),
        insn(LDX_DW, 1, 1, 0, 0),
        // r6 = fdt->max_fds (read as the programs do, then dropped); r1 = fdt->fd
        insn(MOV_K, 6, 0, 0, 0),
        insn(ADD_K, 1, 0, 0, imm(o.fdt_max_fds)),
        insn(LDX_W, 6, 1, 0, 0),
        insn(ADD_K, 1, 0, 0, imm(o.fdt_fd) - imm(o.fdt_max_fds)),
        insn(LDX_DW, 1, 1, 0, 0),
        // r0 = bpf_rdonly_cast(r1, slot_type); r1 = slot->ki_filp
        insn(MOV_K, 2, 0, 0, imm(walk.slot_type)),
        insn(CALL, 0, KFUNC_CALL, 0, imm(walk.rdonly_cast)),
        insn(LDX_DW, 1, 0, 0, 0),
        // r1 = file->f_inode; r0 = inode->i_rdev
        insn(ADD_K, 1, 0, 0, imm(o.file_inode)),
        insn(LDX_DW, 1, 1, 0, 0),
        insn(ADD_K, 1, 0, 0, imm(o.inode_rdev)),
        insn(LDX_W, 0, 1, 0, 0),
        insn(MOV_K, 0, 0, 0, 0),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// `union bpf_attr` for `BPF_PROG_LOAD`, as far as the probe sets it; the rest stays zero.
#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    rest: [u8; 96],
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TYPE_TRACEPOINT: u32 = 5;

/// Whether this kernel verifies the typed walk in a tracepoint program; the verifier's
/// complaint otherwise (its log's last lines).
///
/// # Errors
/// The verifier's log, or the load's error.
pub fn verifies(o: &FileOffsets, walk: TypedWalk) -> Result<(), String> {
    let program = probe_program(o, walk);
    let mut log = vec![0u8; 16 * 1024];
    let attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_TRACEPOINT,
        insn_cnt: u32::try_from(program.len()).unwrap_or(u32::MAX),
        insns: program.as_ptr() as u64,
        license: c"GPL".as_ptr() as u64,
        log_level: 1,
        log_size: u32::try_from(log.len()).unwrap_or(u32::MAX),
        log_buf: log.as_mut_ptr() as u64,
        rest: [0; 96],
    };
    // SAFETY: `attr` and the buffers it points at outlive the call; the kernel reads
    // `size_of::<ProgLoad>()` bytes of it and writes at most `log_size` bytes of log.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &raw const attr,
            size_of::<ProgLoad>(),
        )
    };
    if fd >= 0 {
        // SAFETY: the fd was just returned to us and is closed once.
        unsafe { libc::close(i32::try_from(fd).unwrap_or(-1)) };
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    let text = String::from_utf8_lossy(&log);
    let text = text.trim_end_matches('\0').trim_end();
    let tail: Vec<&str> = text.lines().rev().take(3).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(format!("{err}: {}", tail.join(" / ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_call_becomes_the_kfunc_or_a_no_op() {
        let placeholder = kfunc::call(kfunc::RDONLY_CAST_PLACEHOLDER).to_le_bytes();
        let mut object = vec![0xaa; 8];
        object.extend_from_slice(&placeholder);
        object.extend_from_slice(&[0x55; 8]);
        object.extend_from_slice(&placeholder);
        let (patched, n) = patch(&object, Some(0x1234));
        assert_eq!(n, 2);
        assert_eq!(&patched[8..16], &[0x85, 0x20, 0, 0, 0x34, 0x12, 0, 0]);
        assert_eq!(&patched[24..32], &[0x85, 0x20, 0, 0, 0x34, 0x12, 0, 0]);
        assert_eq!(&patched[..8], &object[..8]);
        let (off, n) = patch(&object, None);
        assert_eq!(n, 2);
        assert_eq!(&off[8..16], &[0xb7, 0, 0, 0, 0, 0, 0, 0]);
    }

    /// This kernel (Linux 6.18, root) verifies the walk; elsewhere the test has nothing to say.
    #[test]
    fn this_kernel_verifies_the_typed_walk() {
        // SAFETY: a plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let Ok(btf) =
            super::super::btf::Btf::from_path(std::path::Path::new(super::super::BTF_PATH))
        else {
            return;
        };
        let files = btf
            .file_offsets()
            .expect("the kernel's BTF has the file offsets");
        let walk = btf
            .typed_walk()
            .expect("the kernel has bpf_rdonly_cast and kiocb");
        verifies(&files, walk).expect("the verifier accepts the walk");
    }

    #[test]
    fn a_placeholder_off_the_instruction_grid_is_left_alone() {
        let placeholder = kfunc::call(kfunc::RDONLY_CAST_PLACEHOLDER).to_le_bytes();
        let mut object = vec![0; 4];
        object.extend_from_slice(&placeholder);
        object.extend_from_slice(&[0; 4]);
        let (patched, n) = patch(&object, Some(7));
        assert_eq!(n, 0);
        assert_eq!(patched, object);
    }
}
