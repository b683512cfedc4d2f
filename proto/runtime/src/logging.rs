//! Logging: `tracing` events to standard error (standard output is the binaries' data: tables
//! and JSON), filtered by `RUST_LOG`.

/// Sends `tracing` events to standard error at `default` level (e.g. `"info"`) unless `RUST_LOG`
/// says otherwise. A second call, or a wrapping binary that set a subscriber up first, keeps the
/// first one.
pub fn init(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
