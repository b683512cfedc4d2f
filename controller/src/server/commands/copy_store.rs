//! `gpuwarden-controller copy-store`: every record of one store into another (from sled into
//! etcd, say).

use std::process::ExitCode;

use crate::{
    server::config::EtcdTlsArgs,
    store::{Store, StoreSpec},
};

/// `copy-store`'s flags.
#[derive(clap::Args)]
pub(in crate::server) struct CopyStoreArgs {
    /// The store to read: sled:PATH or etcd://….
    #[arg(long, value_name = "SPEC")]
    from: StoreSpec,
    /// The store to write: sled:PATH or etcd://….
    #[arg(long, value_name = "SPEC")]
    to: StoreSpec,
    /// TLS to etcd, for whichever side is etcd.
    #[command(flatten)]
    etcd_tls: EtcdTlsArgs,
}

/// `gpuwarden-controller copy-store`: every record of `from` into `to`.
pub(in crate::server) fn main(args: CopyStoreArgs) -> ExitCode {
    let CopyStoreArgs { from, to, etcd_tls } = args;
    let (from, to) = (etcd_tls.clone().apply(from), etcd_tls.apply(to));
    copy_store(&from, &to)
}

/// Every record of `from` into `to`.
fn copy_store(from: &StoreSpec, to: &StoreSpec) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpuwarden-controller: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let copied = runtime.block_on(async {
        let source = Store::open(from).await?;
        let target = Store::open(to).await?;
        source.copy_to(&target).await
    });
    match copied {
        Ok(n) => {
            println!("copied {n} records from {from} to {to}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpuwarden-controller copy-store: {e}");
            ExitCode::FAILURE
        }
    }
}
