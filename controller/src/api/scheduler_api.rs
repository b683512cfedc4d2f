//! [`SchedulerApi`], the client-facing service's state: the hub, how callers authenticate and
//! the bounds they are held to. Its RPCs are in `sessions` (sessions, nodes, slot types) and
//! `queues` (team queues); both take it from here.

use std::sync::Arc;

use tonic::{Request, Status};

use super::pages::Pager;
use crate::{
    auth::clients::{Caller, ClientAuth},
    hub::Hub,
    limits::Bounds,
};

/// The client-facing service: the controller, how its callers authenticate, and the bounds
/// they are held to.
#[derive(Clone)]
pub struct SchedulerApi {
    /// The controller core.
    pub controller: Arc<Hub>,
    /// How callers authenticate and what they may do.
    pub clients: Arc<ClientAuth>,
    /// The bounds callers are held to.
    pub bounds: Arc<Bounds>,
}

impl SchedulerApi {
    /// The page of list `list` a request asks for.
    pub(super) fn pager(
        &self,
        list: &'static str,
        page_token: &str,
        page_size: u32,
    ) -> Result<Pager, Status> {
        let limits = &self.bounds.limits;
        Pager::new(
            list,
            page_token,
            page_size,
            limits.max_page_size,
            limits.max_id_len,
        )
    }

    /// Who sent `request`, once it is known and within its rate.
    pub(super) fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let caller = self.clients.caller(request)?;
        self.bounds
            .counted(self.bounds.admit_call(&self.counted_as(&caller, request)))?;
        Ok(caller)
    }

    /// Whom `caller`'s calls and streams count against: its name, or in open mode (where
    /// everyone is `default`) its address.
    pub(super) fn counted_as<T>(&self, caller: &Caller, request: &Request<T>) -> String {
        match request.remote_addr() {
            Some(addr) if self.clients.is_open() => addr.ip().to_string(),
            _ => caller.name.clone(),
        }
    }
}
