//! The driver tier of GPU-memory enforcement: NVIDIA's own per-cgroup limit through the kernel's
//! `dmem` cgroup controller (docs/accounting.md, "The driver's own limit").
//!
//! Where the driver (r615 or newer) registers its GPUs with `dmem` (kernel 6.14 or newer), the
//! root cgroup's `dmem.capacity` lists one region per GPU, `nvidia/<pci>/vidmem <bytes>`. For
//! each bound cgroup the agent writes the quota's limit on each GPU as that region's `dmem.max`
//! (the hard limit: an allocation past it fails with out-of-memory and the process lives), after
//! enabling the controller on the cgroup's ancestors (`+dmem` in `cgroup.subtree_control`), and
//! writes `max` back when the binding ends. The eBPF accounting keeps counting as the witness.
//!
//! File formats, from the kernel's cgroup-v2 documentation ("DMEM Interface Files"): every file
//! is nested-keyed, one `<region> <value>` line per region; `dmem.capacity` (root only) gives
//! bytes, `dmem.current` bytes, `dmem.max`/`dmem.min`/`dmem.low` bytes or `max`. A write names
//! the region it sets: `<region> <bytes|max>`.
//!
//! Everything here reads and writes files under a cgroup-v2 root, so the unit tests run the same
//! code on a directory laid out like one.

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
};

/// Why the driver tier could not act.
#[derive(Debug, thiserror::Error)]
pub enum DmemError {
    /// A `dmem` or cgroup file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A `dmem` or cgroup file could not be written.
    #[error("cannot write {:?} to {}: {source}", line, path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What was written.
        line: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The cgroup is not under the root the regions were read from.
    #[error("{} is not under the cgroup root {}", dir.display(), root.display())]
    OutsideRoot {
        /// The cgroup.
        dir: PathBuf,
        /// The root.
        root: PathBuf,
    },
}

/// A value of a `dmem` limit file: bytes, or no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// At most this many bytes.
    Bytes(u64),
    /// `max`: no limit.
    Max,
}

/// Parses a nested-keyed `dmem` file: `<region> <bytes|max>` per line.
#[must_use]
pub fn parse(text: &str) -> BTreeMap<String, Limit> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let region = words.next()?;
            let value = match words.next()? {
                "max" => Limit::Max,
                n => Limit::Bytes(n.parse().ok()?),
            };
            Some((region.to_owned(), value))
        })
        .collect()
}

/// NVIDIA's GPU regions in a `dmem.capacity`, in PCI order: `nvidia/<pci>/vidmem`.
#[must_use]
pub fn gpu_regions(capacity: &str) -> Vec<String> {
    // The PCI addresses are fixed-width hex, so their text order is the bus order.
    parse(capacity)
        .into_keys()
        .filter(|r| r.starts_with("nvidia/") && r.ends_with("/vidmem"))
        .collect()
}

/// The `dmem` controller under a cgroup-v2 root, with the driver's GPU regions.
#[derive(Debug, Clone)]
pub struct DmemTree {
    root: PathBuf,
    /// Region of GPU index `i`.
    regions: Vec<String>,
}

impl DmemTree {
    /// The tier at the cgroup-v2 root `root`: `None` when the kernel has no `dmem` controller or
    /// the driver lists no GPU region (driver older than r615, or its internal backend).
    ///
    /// GPU index `i` is taken to be the `i`-th region in PCI order, the order NVML numbers
    /// GPUs in by default.
    #[must_use]
    pub fn open(root: &Path) -> Option<Self> {
        let capacity = std::fs::read_to_string(root.join("dmem.capacity")).ok()?;
        let regions = gpu_regions(&capacity);
        (!regions.is_empty()).then(|| Self {
            root: root.to_owned(),
            regions,
        })
    }

    /// The region of GPU `index`.
    #[must_use]
    pub fn region(&self, index: u32) -> Option<&str> {
        self.regions.get(index as usize).map(String::as_str)
    }

    /// Enables the controller on every ancestor of `dir` below and at the root, so `dir` gets
    /// its `dmem.*` files.
    fn enable(&self, dir: &Path) -> Result<(), DmemError> {
        let rel = dir
            .strip_prefix(&self.root)
            .map_err(|_| DmemError::OutsideRoot {
                dir: dir.to_owned(),
                root: self.root.clone(),
            })?;
        let mut at = self.root.clone();
        for part in rel {
            write_line(&at.join("cgroup.subtree_control"), "+dmem")?;
            at.push(part);
        }
        Ok(())
    }

    /// The limits set on the cgroup at `dir`.
    ///
    /// # Errors
    /// Its `dmem.max` can't be read.
    pub fn max(&self, dir: &Path) -> Result<BTreeMap<String, Limit>, DmemError> {
        let path = dir.join("dmem.max");
        std::fs::read_to_string(&path)
            .map(|text| parse(&text))
            .map_err(|source| DmemError::Read { path, source })
    }
}

fn write_line(path: &Path, line: &str) -> Result<(), DmemError> {
    // One write per line: cgroupfs takes one setting per write.
    std::fs::write(path, format!("{line}\n")).map_err(|source| DmemError::Write {
        path: path.to_owned(),
        line: line.to_owned(),
        source,
    })
}

/// Sets `changes` in the `dmem.max` of the cgroup at `dir`, in one write of every region's line
/// (the kernel takes several lines per write; rewriting a region's current value changes
/// nothing).
fn update(dir: &Path, changes: &[(&str, Limit)]) -> Result<(), DmemError> {
    let path = dir.join("dmem.max");
    let mut limits = match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
        Err(source) => return Err(DmemError::Read { path, source }),
    };
    for (region, limit) in changes {
        limits.insert((*region).to_owned(), *limit);
    }
    let text: Vec<String> = limits
        .iter()
        .map(|(region, limit)| match limit {
            Limit::Bytes(n) => format!("{region} {n}"),
            Limit::Max => format!("{region} max"),
        })
        .collect();
    write_line(&path, &text.join("\n"))
}

/// The driver's own per-cgroup GPU-memory limit, the strongest memory tier where the node has
/// it (`dmem.max` of NVIDIA's regions), as the enforcer's kernel seam sees it: [`DmemTree`] on
/// a host, a fake in tests.
pub(crate) trait DriverLimits: Send {
    /// Sets the hard limit of each `(GPU index, bytes)` on the cgroup at `dir`; returns the GPUs
    /// it set (those the driver has a region for).
    ///
    /// # Errors
    /// A cgroup file can't be written.
    fn set(&mut self, dir: &Path, limits: &[(u32, u64)]) -> Result<Vec<u32>, DmemError>;
    /// Lifts the limits of `gpus` on the cgroup at `dir`.
    ///
    /// # Errors
    /// A cgroup file can't be written.
    fn lift(&mut self, dir: &Path, gpus: &[u32]) -> Result<(), DmemError>;
    /// The tier's name in snapshots (`driver_dmem`).
    fn tier(&self) -> &'static str;
}

impl DriverLimits for DmemTree {
    fn set(&mut self, dir: &Path, limits: &[(u32, u64)]) -> Result<Vec<u32>, DmemError> {
        self.enable(dir)?;
        let known: Vec<(u32, &str, u64)> = limits
            .iter()
            .filter_map(|&(gpu, bytes)| Some((gpu, self.region(gpu)?, bytes)))
            .collect();
        let changes: Vec<(&str, Limit)> = known
            .iter()
            .map(|&(_, region, bytes)| (region, Limit::Bytes(bytes)))
            .collect();
        if !changes.is_empty() {
            update(dir, &changes)?;
        }
        Ok(known.into_iter().map(|(gpu, _, _)| gpu).collect())
    }

    fn lift(&mut self, dir: &Path, gpus: &[u32]) -> Result<(), DmemError> {
        if !dir.exists() {
            // The cgroup is gone, and its limits with it.
            return Ok(());
        }
        let changes: Vec<(&str, Limit)> = gpus
            .iter()
            .filter_map(|&gpu| Some((self.region(gpu)?, Limit::Max)))
            .collect();
        if changes.is_empty() {
            return Ok(());
        }
        update(dir, &changes)
    }

    fn tier(&self) -> &'static str {
        "driver_dmem"
    }
}

#[cfg(test)]
mod tests;
