//! The kernel's own type information (BTF), read for the few struct offsets the programs need to
//! find the file behind an fd: `task_struct.files → files_struct.fdt → fdtable.fd[fd] →
//! file.f_inode → inode.i_rdev` (and the inode's superblock device and number).
//!
//! Rust eBPF programs get no CO-RE relocations, so the offsets are looked up here, in
//! `/sys/kernel/btf/vmlinux`, and handed to the programs with the load-time settings. The parser
//! reads only what it needs: type names, and the members of structs and unions (descending into
//! anonymous ones).

use std::{collections::HashMap, path::Path};

use gpuwarden_agent_common::config::{FileOffsets, file_refs};

/// Why the offsets could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The file can't be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The data isn't BTF (or is truncated).
    #[error("not BTF data: {0}")]
    Malformed(&'static str),
    /// A struct or member the programs need is missing.
    #[error("the kernel's BTF has no {0}")]
    Missing(String),
}

const MAGIC: u16 = 0xeb9f;

/// BTF kinds whose extra data the parser must skip or read.
mod kind {
    pub const INT: u32 = 1;
    pub const ARRAY: u32 = 3;
    pub const STRUCT: u32 = 4;
    pub const UNION: u32 = 5;
    pub const ENUM: u32 = 6;
    pub const FUNC: u32 = 12;
    pub const FUNC_PROTO: u32 = 13;
    pub const VAR: u32 = 14;
    pub const DATASEC: u32 = 15;
    pub const DECL_TAG: u32 = 17;
    pub const ENUM64: u32 = 19;
}

/// A struct or union member: its name, type and offset in bits.
#[derive(Debug, Clone)]
struct Member {
    name: u32,
    ty: u32,
    bit_offset: u32,
}

/// One type: its kind, name and (for structs and unions) members.
#[derive(Debug, Clone)]
struct Type {
    kind: u32,
    name: u32,
    members: Vec<Member>,
}

/// Parsed BTF: types by id (from 1) and the string section.
pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
    structs: HashMap<String, u32>,
}

fn u32_at(data: &[u8], at: usize) -> Result<u32, BtfError> {
    data.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(BtfError::Malformed("truncated"))
}

impl Btf {
    /// Reads the running kernel's BTF.
    ///
    /// # Errors
    /// The file can't be read or parsed.
    pub fn from_path(path: &Path) -> Result<Self, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&data)
    }

    /// Parses little-endian BTF data.
    ///
    /// # Errors
    /// It isn't BTF, or is truncated.
    pub fn parse(data: &[u8]) -> Result<Self, BtfError> {
        let magic = data
            .get(0..2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .ok_or(BtfError::Malformed("truncated"))?;
        if magic != MAGIC {
            return Err(BtfError::Malformed("bad magic (or big-endian)"));
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let type_off = u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        let types_at = hdr_len + type_off;
        let type_data = data
            .get(types_at..types_at + type_len)
            .ok_or(BtfError::Malformed("type section out of bounds"))?;
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(BtfError::Malformed("string section out of bounds"))?
            .to_vec();
        let mut types = Vec::new();
        let mut at = 0;
        while at < type_data.len() {
            let name = u32_at(type_data, at)?;
            let info = u32_at(type_data, at + 4)?;
            at += 12;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 != 0;
            let mut members = Vec::new();
            at += match kind {
                kind::INT | kind::VAR | kind::DECL_TAG => 4,
                kind::ARRAY => 12,
                kind::STRUCT | kind::UNION => {
                    for i in 0..vlen {
                        let m = at + i * 12;
                        let offset = u32_at(type_data, m + 8)?;
                        members.push(Member {
                            name: u32_at(type_data, m)?,
                            ty: u32_at(type_data, m + 4)?,
                            // With kind_flag, the top byte is a bitfield's size.
                            bit_offset: if kind_flag {
                                offset & 0xff_ffff
                            } else {
                                offset
                            },
                        });
                    }
                    vlen * 12
                }
                kind::ENUM | kind::FUNC_PROTO => vlen * 8,
                kind::DATASEC | kind::ENUM64 => vlen * 12,
                _ => 0,
            };
            types.push(Type {
                kind,
                name,
                members,
            });
        }
        let mut btf = Self {
            types,
            strings,
            structs: HashMap::new(),
        };
        for (i, t) in btf.types.iter().enumerate() {
            if t.kind == kind::STRUCT && t.name != 0 {
                let name = btf.string(t.name).to_owned();
                // The first definition wins (BTF may repeat a name in modules; vmlinux doesn't).
                btf.structs
                    .entry(name)
                    .or_insert(u32::try_from(i + 1).unwrap_or(u32::MAX));
            }
        }
        Ok(btf)
    }

    fn string(&self, offset: u32) -> &str {
        let start = offset as usize;
        let tail = self.strings.get(start..).unwrap_or_default();
        let end = tail.iter().position(|b| *b == 0).unwrap_or(tail.len());
        std::str::from_utf8(&tail[..end]).unwrap_or("")
    }

    fn ty(&self, id: u32) -> Option<&Type> {
        self.types.get(usize::try_from(id).ok()?.checked_sub(1)?)
    }

    /// The byte offset of member `member` of struct `name`, looking into anonymous structs and
    /// unions.
    ///
    /// # Errors
    /// The struct or the member doesn't exist.
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u32, BtfError> {
        let id = self
            .structs
            .get(name)
            .ok_or_else(|| BtfError::Missing(format!("struct {name}")))?;
        self.find(*id, member, 0)
            .map(|bits| bits / 8)
            .ok_or_else(|| BtfError::Missing(format!("{name}.{member}")))
    }

    fn find(&self, id: u32, member: &str, base: u32) -> Option<u32> {
        let t = self.ty(id)?;
        for m in &t.members {
            if m.name == 0 {
                // An anonymous struct or union: its members are the parent's.
                let inner = self.ty(m.ty)?;
                if (inner.kind == kind::STRUCT || inner.kind == kind::UNION)
                    && let Some(found) = self.find(m.ty, member, base + m.bit_offset)
                {
                    return Some(found);
                }
            } else if self.string(m.name) == member {
                return Some(base + m.bit_offset);
            }
        }
        None
    }

    /// The offsets the programs need to find an fd's file and identify it.
    ///
    /// # Errors
    /// A struct or member is missing.
    pub fn file_offsets(&self) -> Result<FileOffsets, BtfError> {
        let (file_refs, file_refs_kind) = self.file_refs();
        Ok(FileOffsets {
            task_files: self.member_offset("task_struct", "files")?,
            files_fdt: self.member_offset("files_struct", "fdt")?,
            files_fdtab: self.member_offset("files_struct", "fdtab")?,
            fdt_max_fds: self.member_offset("fdtable", "max_fds")?,
            fdt_fd: self.member_offset("fdtable", "fd")?,
            file_inode: self.member_offset("file", "f_inode")?,
            inode_rdev: self.member_offset("inode", "i_rdev")?,
            inode_sb: self.member_offset("inode", "i_sb")?,
            inode_ino: self.member_offset("inode", "i_ino")?,
            sb_dev: self.member_offset("super_block", "s_dev")?,
            // Set once the kernel is seen to verify the typed walk (`Self::typed_walk`).
            slot_type: 0,
            file_refs,
            file_refs_kind,
            valid: 1,
        })
    }

    /// Where the open file's reference count is, and how it counts: `f_ref` (a `file_ref_t`,
    /// 6.13 and later), else `f_count` (an `atomic_long_t`); `(0, ABSENT)` where neither is.
    fn file_refs(&self) -> (u32, u32) {
        if let Ok(at) = self.member_offset("file", "f_ref") {
            (at, file_refs::FILE_REF)
        } else if let Ok(at) = self.member_offset("file", "f_count") {
            (at, file_refs::COUNT)
        } else {
            (0, file_refs::ABSENT)
        }
    }

    /// What the typed walk needs (`agent-ebpf/src/btf_walk.rs`): the `bpf_rdonly_cast` kfunc and
    /// a struct whose first member is a `struct file *` (`kiocb.ki_filp`) to cast the fd table's
    /// slot to.
    ///
    /// # Errors
    /// The kernel has no such kfunc, or `kiocb` isn't laid out so.
    pub fn typed_walk(&self) -> Result<TypedWalk, BtfError> {
        let rdonly_cast = self
            .func_id(RDONLY_CAST)
            .ok_or_else(|| BtfError::Missing(format!("kfunc {RDONLY_CAST}")))?;
        if self.member_offset("kiocb", "ki_filp")? != 0 {
            return Err(BtfError::Missing(
                "kiocb.ki_filp as its first member".to_owned(),
            ));
        }
        let slot_type = *self
            .structs
            .get("kiocb")
            .ok_or_else(|| BtfError::Missing("struct kiocb".to_owned()))?;
        Ok(TypedWalk {
            rdonly_cast,
            slot_type,
        })
    }

    /// The id of the function (`BTF_KIND_FUNC`) named `name`.
    fn func_id(&self, name: &str) -> Option<u32> {
        let at = self
            .types
            .iter()
            .position(|t| t.kind == kind::FUNC && self.string(t.name) == name)?;
        u32::try_from(at + 1).ok()
    }
}

/// The kfunc that types the fd table's slot.
const RDONLY_CAST: &str = "bpf_rdonly_cast";

/// BTF ids the typed walk needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypedWalk {
    /// The `bpf_rdonly_cast` kfunc, written into the programs' calls to it.
    pub rdonly_cast: u32,
    /// `struct kiocb`, the cast's target (`FileOffsets::slot_type`).
    pub slot_type: u32,
}

#[cfg(test)]
mod tests;
