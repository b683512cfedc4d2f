//! Quantities as people read them in tables (JSON documents keep exact numbers).

/// `bytes` in binary units with one decimal: `512 B`, `2.0 MiB`, `3.5 GiB`.
#[must_use]
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    // Display only: the loss of precision past 2^53 bytes doesn't show at one decimal.
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `text` cut to at most `width` characters, ending in `…` when cut, so a table column keeps
/// its width.
#[must_use]
pub fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_in_binary_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(2 << 20), "2.0 MiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
        assert_eq!(human_bytes(80 << 30), "80.0 GiB");
        assert_eq!(human_bytes(u64::MAX), "16384.0 PiB");
    }

    #[test]
    fn long_text_is_cut_to_the_width() {
        assert_eq!(fit("short", 8), "short");
        assert_eq!(fit("exactly8", 8), "exactly8");
        assert_eq!(fit("a-much-longer-name", 8), "a-much-…");
        assert_eq!(fit("ünïcödé-name", 5).chars().count(), 5);
    }
}
