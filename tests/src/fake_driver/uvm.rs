//! `/dev/nvidia-uvm`: every command the agent names succeeds.
//!
//! UVM commands aren't `_IOC`-encoded, so FUSE passes no data; where the params' `rmStatus` sits
//! at an offset every driver agrees on, the fake writes `NV_OK` there through the argument
//! pointer, as the real driver does.

use crate::abi::nvidia::{status, uvm};

use super::{caller::CallerMemory, rm::Errno};
use crate::abi::uvm_params::rm_status_offset;

/// Answers UVM command `cmd`; `arg` finds the caller's argument pointer when one is needed.
/// Returns the command's name.
pub(crate) fn answer(
    cmd: u32,
    mem: &dyn CallerMemory,
    arg: impl FnOnce() -> Option<u64>,
) -> Result<&'static str, Errno> {
    // Like the real driver, a number it doesn't know is an invalid argument.
    let name = uvm::name(cmd).ok_or(libc::EINVAL)?;
    if let Some(offset) = rm_status_offset(cmd) {
        let at = arg()
            .and_then(|a| a.checked_add(offset as u64))
            .ok_or(libc::EFAULT)?;
        mem.write(at, &status::OK.to_le_bytes())
            .map_err(|_| libc::EFAULT)?;
    }
    Ok(name)
}

#[cfg(test)]
mod tests;
