//! Little-endian fields of parameter structs, read and written at byte offsets.
//!
//! Out-of-range offsets read as 0 and writes to them are dropped: callers check a struct's size
//! before touching its fields, so this only keeps a malformed ioctl from panicking a peer.

/// The `u32` at `off`, or 0 past the end.
pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// The `u64` at `off`, or 0 past the end.
pub(crate) fn u64_at(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Writes `v` at `off` when it fits.
pub(crate) fn set_u32(b: &mut [u8], off: usize, v: u32) {
    if let Some(s) = b.get_mut(off..off + 4) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}

/// Writes `v` at `off` when it fits.
pub(crate) fn set_u64(b: &mut [u8], off: usize, v: u64) {
    if let Some(s) = b.get_mut(off..off + 8) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_out_of_range_is_harmless() {
        let mut b = [0u8; 12];
        set_u32(&mut b, 0, 0xdead_beef);
        set_u64(&mut b, 4, 0x0102_0304_0506_0708);
        assert_eq!(u32_at(&b, 0), 0xdead_beef);
        assert_eq!(u64_at(&b, 4), 0x0102_0304_0506_0708);
        assert_eq!(b[4], 0x08, "little endian");
        set_u32(&mut b, 10, 1);
        set_u64(&mut b, 8, 1);
        assert_eq!(u32_at(&b, 10), 0);
        assert_eq!(u64_at(&b, 8), 0);
    }
}
