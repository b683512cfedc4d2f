//! The programs' events: read from the ring buffer in batches, logged by kind, and the
//! programs' aya-log records forwarded to `tracing` (docs/architecture.md, "Kernel-side logs").

use aya::maps::{MapData, RingBuf};
use gpuwarden_agent_common::event::{Event, decode_error, kind};
use tokio::io::unix::AsyncFd;

use super::{KernelLogger, gpu_nodes::DeviceNames};

/// The ring buffer, registered with the async runtime.
pub(crate) type EventRing = AsyncFd<RingBuf<MapData>>;

/// Registers the ring buffer for async reads.
///
/// # Errors
/// The fd can't be polled.
pub(crate) fn register(ring: RingBuf<MapData>) -> std::io::Result<EventRing> {
    // SAFETY: the ring buffer owns its fd and keeps it open until the AsyncFd drops it.
    unsafe { AsyncFd::register(ring) }.map_err(Into::into)
}

/// Waits for events and returns every one ready; `None` once the ring buffer can't be read.
pub(crate) async fn next_batch(ring: &mut EventRing) -> Option<Vec<Event>> {
    loop {
        let Ok(mut guard) = ring.readable_mut().await else {
            tracing::error!("event ring buffer stopped being readable");
            return None;
        };
        let inner = guard.get_inner_mut();
        let mut batch = Vec::new();
        while let Some(item) = inner.next() {
            if item.len() >= size_of::<Event>() {
                // SAFETY: the kernel writes whole `Event`s; read_unaligned copes with alignment.
                batch.push(unsafe { item.as_ptr().cast::<Event>().read_unaligned() });
            }
        }
        guard.clear_ready();
        if !batch.is_empty() {
            return Some(batch);
        }
    }
}

/// The process name of an event.
fn comm(e: &Event) -> String {
    String::from_utf8_lossy(e.comm.split(|b| *b == 0).next().unwrap_or_default()).into_owned()
}

/// What a decode error's code means.
#[must_use]
pub(crate) fn decode_error_reason(code: u32) -> &'static str {
    match code {
        decode_error::READ_PARAMS => "params unreadable",
        decode_error::BAD_SIZE => "unexpected params size",
        decode_error::READ_ALLOC_PARAMS => "allocation params unreadable",
        decode_error::DEVICE_OUT_OF_RANGE => "GPU index out of range",
        decode_error::READ_RESULT => "result unreadable",
        _ => "unknown",
    }
}

/// Logs an event at the level its kind deserves (enforcement events are logged where they are
/// tied to their session), its device named as `names` says.
pub(crate) fn log(e: &Event, names: &DeviceNames) {
    let comm = comm(e);
    let device = names.name(e.device);
    match e.kind {
        kind::NEW_PROCESS => {
            tracing::info!(tgid = e.tgid, %comm, cgroup = e.cgroup, %device, "new GPU process");
        }
        kind::ALLOC => {
            tracing::debug!(tgid = e.tgid, %comm, %device, bytes = e.bytes, handle = e.handle, "GPU memory allocated");
        }
        kind::FREE => {
            tracing::debug!(tgid = e.tgid, %comm, %device, bytes = e.bytes, handle = e.handle, "GPU memory freed");
        }
        kind::CLIENT_FREE => {
            tracing::debug!(tgid = e.tgid, %comm, bytes = e.bytes, client = e.client, "GPU client freed");
        }
        kind::FORK => tracing::debug!(tgid = e.tgid, child = e.handle, "GPU process forked"),
        kind::PROCESS_EXIT => {
            tracing::debug!(tgid = e.tgid, %comm, bytes = e.bytes, "GPU process ended");
        }
        kind::EXEC => tracing::debug!(tgid = e.tgid, %comm, bytes = e.bytes, "GPU process exec'd"),
        kind::QUOTA_EXCEEDED | kind::DEVICE_DENIED => {}
        kind::TABLE_BUDGET => {
            let table = gpuwarden_agent_common::maps::table::NAMES
                .get(e.code as usize)
                .copied()
                .unwrap_or("unknown");
            tracing::warn!(
                cgroup = e.cgroup,
                table,
                budget = e.limit,
                "a cgroup reached its budget in a kernel table: its further entries are refused"
            );
        }
        kind::DECODE_ERROR => {
            let reason = decode_error_reason(e.code);
            tracing::warn!(tgid = e.tgid, %comm, escape = format_args!("{:#x}", e.handle), reason, detail = format_args!("{:#x}", e.bytes), "ioctl not decoded");
        }
        other => tracing::warn!(kind = other, "unknown event kind"),
    }
}

/// Forwards the programs' aya-log records to `tracing` from a task of its own.
pub(crate) fn spawn_kernel_log(logger: KernelLogger) {
    // SAFETY: the logger owns its ring buffer's fd and keeps it open until the AsyncFd drops it.
    match unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) } {
        Ok(mut fd) => {
            tokio::spawn(async move {
                loop {
                    let Ok(mut guard) = fd.readable_mut().await else {
                        return;
                    };
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
            });
        }
        Err(e) => tracing::warn!(
            "kernel-side logging unavailable: {}",
            std::io::Error::from(e)
        ),
    }
}
