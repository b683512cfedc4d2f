//! Bounds on what clients and agents may send, in one place.
//!
//! [`Limits`] holds every bound with its default; the controller's config file overrides any of
//! them in a `[limits]` table (keys as the field names). [`Bounds`] is what both services share
//! at run time: the limits, the open Watch streams per caller, and a token bucket ([`Bucket`])
//! per client and per agent stream.
//!
//! Refusals follow one rule: a malformed or oversized value is `INVALID_ARGUMENT` naming the
//! field and the limit's key; a cap or a rate is `RESOURCE_EXHAUSTED` naming the limit's key.
//! Each refusal is counted by a bounded reason ([`count_of`]), process-wide, like the denials of
//! [`crate::auth::denials`]. Values are checked *before* they are parsed further, so an error
//! message never echoes a megabyte back.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use gpuwarden_proto::v1::{self as pb, agent_message::Msg};
use serde::Deserialize;
use tonic::Status;

use crate::slots::SlotName;

/// Every bound, with its default. Config: `[limits]` in the controller's TOML file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest gRPC message either service decodes or encodes, in bytes (4 MiB).
    pub max_message_bytes: usize,
    /// Longest session id, node id or hostname (253: a DNS name).
    pub max_id_len: usize,
    /// Longest session name, class, placement or policy name (128).
    pub max_name_len: usize,
    /// Longest owner (128, as token and certificate names).
    pub max_owner_len: usize,
    /// Longest slot key (64; a slot name never exceeds [`SlotName::MAX_LEN`] whatever this says).
    pub max_slot_key_len: usize,
    /// Longest slot value's text (40: the 33 integer digits, the point and the 6 fractional
    /// digits a fixed-point value holds at most).
    pub max_slot_value_len: usize,
    /// Longest free text: a target's path or id, a device's model, an event's reason (4096).
    pub max_text_len: usize,
    /// Most slots in one request or one node's capacity (64).
    pub max_slots_per_request: usize,
    /// Most sessions not yet ended per owner (1,000).
    pub max_sessions_per_owner: usize,
    /// Most sessions not yet ended in total (100,000).
    pub max_sessions: usize,
    /// Most open Watch streams per caller (16).
    pub max_watches_per_caller: usize,
    /// Most open Watch streams in total (1,024).
    pub max_watches: usize,
    /// Most sessions in one `ListSessions` page (1,000), the default page size too; a page
    /// also stops short of `max_message_bytes`.
    pub max_page_size: usize,
    /// Most requests in flight on one HTTP/2 connection (64).
    pub concurrency_per_connection: usize,
    /// Longest a unary call may take, in seconds (30); streams are not cut by it.
    pub request_timeout_secs: u64,
    /// Seconds between HTTP/2 keepalive pings to an idle peer (30).
    pub keepalive_interval_secs: u64,
    /// Seconds a keepalive ping may go unanswered before the connection is closed (10).
    pub keepalive_timeout_secs: u64,
    /// Most devices a node may register (64).
    pub max_devices_per_node: usize,
    /// Most memory one device may claim, in bytes (16 TiB).
    pub max_device_memory_bytes: u64,
    /// Most slot types a node may register (64).
    pub max_slot_types_per_node: usize,
    /// Most sessions an agent may list as running, or hooks it may name (4,096).
    pub max_list_len: usize,
    /// Messages per second an agent stream may sustain (200).
    pub agent_messages_per_sec: u32,
    /// Messages an agent stream may send in a burst above that rate (2,000).
    pub agent_message_burst: u32,
    /// Calls per second one client (a token's or certificate's owner, however many connections
    /// it opens) may sustain on the scheduler service (2,000).
    pub client_requests_per_sec: u32,
    /// Calls one client may make in a burst above that rate (10,000).
    pub client_request_burst: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_bytes: 4 << 20,
            max_id_len: 253,
            max_name_len: 128,
            max_owner_len: 128,
            max_slot_key_len: SlotName::MAX_LEN,
            max_slot_value_len: 40,
            max_text_len: 4096,
            max_slots_per_request: 64,
            max_sessions_per_owner: 1_000,
            max_sessions: 100_000,
            max_watches_per_caller: 16,
            max_watches: 1_024,
            max_page_size: 1_000,
            concurrency_per_connection: 64,
            request_timeout_secs: 30,
            keepalive_interval_secs: 30,
            keepalive_timeout_secs: 10,
            max_devices_per_node: 64,
            max_device_memory_bytes: 16 << 40,
            max_slot_types_per_node: 64,
            max_list_len: 4_096,
            agent_messages_per_sec: 200,
            agent_message_burst: 2_000,
            client_requests_per_sec: 2_000,
            client_request_burst: 10_000,
        }
    }
}

/// Why a value or a request is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitError {
    /// A string longer than its limit.
    #[error("{field}: {len} bytes, more than the limit of {max} (limits.{key})")]
    TooLong {
        /// The field.
        field: String,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
        /// The limit's config key.
        key: &'static str,
    },
    /// A list or map with more entries than its limit.
    #[error("{field}: {count} entries, more than the limit of {max} (limits.{key})")]
    TooMany {
        /// The field.
        field: String,
        /// How many.
        count: usize,
        /// The limit.
        max: usize,
        /// The limit's config key.
        key: &'static str,
    },
    /// A number above its limit.
    #[error("{field}: {value}, more than the limit of {max} (limits.{key})")]
    TooLarge {
        /// The field.
        field: String,
        /// The value.
        value: u64,
        /// The limit.
        max: u64,
        /// The limit's config key.
        key: &'static str,
    },
    /// A float that is NaN, infinite or negative.
    #[error("{field}: {value} is not a finite, non-negative number")]
    NotFinite {
        /// The field.
        field: String,
        /// The value.
        value: f64,
    },
    /// A cap on how many of something exist at once.
    #[error("{what}: the limit of {max} is reached (limits.{key})")]
    Exhausted {
        /// What is capped, and for whom.
        what: String,
        /// The cap.
        max: usize,
        /// The limit's config key.
        key: &'static str,
    },
    /// An agent stream sent faster than its rate.
    #[error(
        "agent stream of {node:?}: more than {rate} messages/s with bursts of {burst} (limits.agent_messages_per_sec, limits.agent_message_burst); closed"
    )]
    Flood {
        /// The node.
        node: String,
        /// The sustained rate.
        rate: u32,
        /// The burst.
        burst: u32,
    },
    /// A client called faster than its rate.
    #[error(
        "client {caller:?}: more than {rate} calls/s with bursts of {burst} (limits.client_requests_per_sec, limits.client_request_burst); retry later"
    )]
    Rate {
        /// Who called.
        caller: String,
        /// The sustained rate.
        rate: u32,
        /// The burst.
        burst: u32,
    },
}

impl LimitError {
    /// The bounded reason it is counted under.
    #[must_use]
    pub fn reason(&self) -> Refusal {
        match self {
            Self::TooLong { .. } | Self::TooMany { .. } | Self::TooLarge { .. } => {
                Refusal::Oversized
            }
            Self::NotFinite { .. } => Refusal::OutOfRange,
            Self::Exhausted { .. } => Refusal::Cap,
            Self::Flood { .. } => Refusal::Flood,
            Self::Rate { .. } => Refusal::Rate,
        }
    }

    /// The gRPC status a caller gets: `INVALID_ARGUMENT` for a value, `RESOURCE_EXHAUSTED` for
    /// a cap or a rate.
    #[must_use]
    pub fn to_status(&self) -> Status {
        match self {
            Self::Exhausted { .. } | Self::Flood { .. } | Self::Rate { .. } => {
                Status::resource_exhausted(self.to_string())
            }
            _ => Status::invalid_argument(self.to_string()),
        }
    }
}

impl From<LimitError> for Status {
    /// Counts the refusal, then answers [`LimitError::to_status`].
    fn from(e: LimitError) -> Self {
        count(e.reason());
        e.to_status()
    }
}

/// Why something was refused or dropped, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A string, list or number over its limit.
    Oversized,
    /// A float that is NaN, infinite or negative.
    OutOfRange,
    /// A cap on sessions or Watch streams.
    Cap,
    /// An agent stream closed for its rate.
    Flood,
    /// A client's call refused for its rate.
    Rate,
    /// An agent's usage or event for a session not on its node, dropped.
    ForeignSession,
    /// An agent's event, usage report or heartbeat over its stream's rate, dropped: the stream
    /// stays open (a tenant allocating in a loop must not cut its node off).
    FloodDropped,
}

impl Refusal {
    /// Every reason, in the order of the counters.
    pub const ALL: [Self; 7] = [
        Self::Oversized,
        Self::OutOfRange,
        Self::Cap,
        Self::Flood,
        Self::Rate,
        Self::ForeignSession,
        Self::FloodDropped,
    ];

    /// A stable name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Oversized => "oversized",
            Self::OutOfRange => "out_of_range",
            Self::Cap => "cap",
            Self::Flood => "flood",
            Self::Rate => "rate",
            Self::ForeignSession => "foreign_session",
            Self::FloodDropped => "flood_dropped",
        }
    }
}

static REFUSED: [AtomicU64; Refusal::ALL.len()] = [const { AtomicU64::new(0) }; Refusal::ALL.len()];

/// Counts one refusal or drop.
pub fn count(reason: Refusal) {
    REFUSED[reason as usize].fetch_add(1, Ordering::Relaxed);
}

/// Refusals or drops for `reason` since the process started.
#[must_use]
pub fn count_of(reason: Refusal) -> u64 {
    REFUSED[reason as usize].load(Ordering::Relaxed)
}

fn len(field: &str, value: &str, max: usize, key: &'static str) -> Result<(), LimitError> {
    if value.len() > max {
        return Err(LimitError::TooLong {
            field: field.to_owned(),
            len: value.len(),
            max,
            key,
        });
    }
    Ok(())
}

fn many(field: &str, count: usize, max: usize, key: &'static str) -> Result<(), LimitError> {
    if count > max {
        return Err(LimitError::TooMany {
            field: field.to_owned(),
            count,
            max,
            key,
        });
    }
    Ok(())
}

fn finite(field: &str, value: f64) -> Result<(), LimitError> {
    if !value.is_finite() || value < 0.0 {
        return Err(LimitError::NotFinite {
            field: field.to_owned(),
            value,
        });
    }
    Ok(())
}

impl Limits {
    /// Checks the limits a config file set: a zero where it would stop all traffic is refused.
    ///
    /// # Errors
    /// The key that is zero.
    pub fn validate(&self) -> Result<(), String> {
        for (key, value) in [
            ("max_message_bytes", self.max_message_bytes),
            (
                "concurrency_per_connection",
                self.concurrency_per_connection,
            ),
            ("max_id_len", self.max_id_len),
            ("max_owner_len", self.max_owner_len),
            ("max_slot_key_len", self.max_slot_key_len),
            ("max_slot_value_len", self.max_slot_value_len),
            ("max_slots_per_request", self.max_slots_per_request),
        ] {
            if value == 0 {
                return Err(format!("{key} = 0 would refuse every request"));
            }
        }
        if self.request_timeout_secs == 0 {
            return Err("request_timeout_secs = 0 would cut every call".to_owned());
        }
        if self.agent_message_burst == 0 {
            return Err("agent_message_burst = 0 would close every agent stream".to_owned());
        }
        if self.client_request_burst == 0 {
            return Err("client_request_burst = 0 would refuse every client call".to_owned());
        }
        Ok(())
    }

    /// A unary call's timeout.
    #[must_use]
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }

    /// A session id, node id or another identifier named `field`.
    ///
    /// # Errors
    /// It is longer than `max_id_len`.
    pub fn id(&self, field: &str, value: &str) -> Result<(), LimitError> {
        len(field, value, self.max_id_len, "max_id_len")
    }

    /// An owner named `field`.
    ///
    /// # Errors
    /// It is longer than `max_owner_len`.
    pub fn owner(&self, field: &str, value: &str) -> Result<(), LimitError> {
        len(field, value, self.max_owner_len, "max_owner_len")
    }

    /// A name, class or other short word named `field`.
    ///
    /// # Errors
    /// It is longer than `max_name_len`.
    pub fn name(&self, field: &str, value: &str) -> Result<(), LimitError> {
        len(field, value, self.max_name_len, "max_name_len")
    }

    fn slot_key_len(&self) -> usize {
        self.max_slot_key_len.min(SlotName::MAX_LEN)
    }

    fn text(&self, field: &str, value: &str) -> Result<(), LimitError> {
        len(field, value, self.max_text_len, "max_text_len")
    }

    /// The slots of `field`: how many, and each key's and value's length (their syntax is the
    /// conversion's to check).
    ///
    /// # Errors
    /// Too many slots, or a key or value too long.
    pub fn slots(&self, field: &str, slots: Option<&pb::ResourceSlot>) -> Result<(), LimitError> {
        let Some(slots) = slots else { return Ok(()) };
        many(
            field,
            slots.values.len(),
            self.max_slots_per_request,
            "max_slots_per_request",
        )?;
        for (key, value) in &slots.values {
            // The key is not echoed: it may be the oversized part.
            len(
                &format!("{field} key"),
                key,
                self.slot_key_len(),
                "max_slot_key_len",
            )?;
            len(
                &format!("{field}[{key}]"),
                value,
                self.max_slot_value_len,
                "max_slot_value_len",
            )?;
        }
        Ok(())
    }

    /// A session to create.
    ///
    /// # Errors
    /// A field over its limit, named.
    pub fn create(&self, r: &pb::CreateSessionRequest) -> Result<(), LimitError> {
        self.owner("owner", &r.owner)?;
        self.name("name", &r.name)?;
        self.id("node_id", &r.node_id)?;
        self.name("class", &r.class)?;
        self.name("placement", &r.placement)?;
        self.slots("requested", r.requested.as_ref())?;
        if let Some(policy) = &r.policy {
            self.name("policy.memory", &policy.memory)?;
            self.name("policy.compute", &policy.compute)?;
        }
        if let Some(t) = &r.target {
            self.target("target", t)?;
        }
        Ok(())
    }

    fn target(&self, field: &str, t: &pb::Target) -> Result<(), LimitError> {
        match &t.kind {
            Some(pb::target::Kind::ContainerId(s) | pb::target::Kind::PodUid(s)) => {
                self.id(field, s)
            }
            Some(pb::target::Kind::CgroupPath(s)) => self.text(&format!("{field}.cgroup_path"), s),
            Some(pb::target::Kind::Managed(_)) | None => Ok(()),
        }
    }

    /// What an agent registers.
    ///
    /// # Errors
    /// A field over its limit, named; a device claiming more memory than a device has.
    pub fn node(&self, info: &pb::NodeInfo) -> Result<(), LimitError> {
        self.id("node_id", &info.node_id)?;
        self.id("hostname", &info.hostname)?;
        self.name("agent_version", &info.agent_version)?;
        many(
            "slot_types",
            info.slot_types.len(),
            self.max_slot_types_per_node,
            "max_slot_types_per_node",
        )?;
        for t in &info.slot_types {
            len(
                "slot_types.name",
                &t.name,
                self.slot_key_len(),
                "max_slot_key_len",
            )?;
        }
        self.slots("capacity", info.capacity.as_ref())?;
        // The controller's GPUs and Kubernetes' are one node's: one bound for both.
        many(
            "devices",
            info.devices.len() + info.kubernetes_devices.len(),
            self.max_devices_per_node,
            "max_devices_per_node",
        )?;
        for (i, d) in info.devices.iter().enumerate() {
            self.device(&format!("devices[{i}]"), d)?;
        }
        for (i, d) in info.kubernetes_devices.iter().enumerate() {
            self.device(&format!("kubernetes_devices[{i}]"), d)?;
        }
        many(
            "observed_sessions",
            info.observed_sessions.len(),
            self.max_list_len,
            "max_list_len",
        )?;
        for (i, o) in info.observed_sessions.iter().enumerate() {
            self.observed(&format!("observed_sessions[{i}]"), o)?;
        }
        many("hooks", info.hooks.len(), self.max_list_len, "max_list_len")?;
        for h in &info.hooks {
            self.name("hooks", h)?;
        }
        self.running("running_sessions", &info.running_sessions)
    }

    /// Whether one more session of `owner` fits, given `mine` of its sessions and `total` in all
    /// not yet ended.
    ///
    /// # Errors
    /// The owner's cap or the total cap is reached.
    pub fn admit_session(&self, owner: &str, mine: usize, total: usize) -> Result<(), LimitError> {
        if mine >= self.max_sessions_per_owner {
            return Err(LimitError::Exhausted {
                what: format!("sessions of {owner:?} not yet ended"),
                max: self.max_sessions_per_owner,
                key: "max_sessions_per_owner",
            });
        }
        if total >= self.max_sessions {
            return Err(LimitError::Exhausted {
                what: "sessions not yet ended".to_owned(),
                max: self.max_sessions,
                key: "max_sessions",
            });
        }
        Ok(())
    }

    fn device(&self, field: &str, d: &pb::Device) -> Result<(), LimitError> {
        self.id(&format!("{field}.uuid"), &d.uuid)?;
        self.name(&format!("{field}.model"), &d.model)?;
        self.text(&format!("{field}.device_node"), &d.device_node)?;
        if d.memory_bytes > self.max_device_memory_bytes {
            return Err(LimitError::TooLarge {
                field: format!("{field}.memory_bytes"),
                value: d.memory_bytes,
                max: self.max_device_memory_bytes,
                key: "max_device_memory_bytes",
            });
        }
        Ok(())
    }

    /// A session an agent observed (a Kubernetes claim it prepared), in `field`.
    ///
    /// # Errors
    /// A field over its limit, named.
    pub fn observed(&self, field: &str, o: &pb::ObservedSession) -> Result<(), LimitError> {
        self.id(&format!("{field}.session_id"), &o.session_id)?;
        many(
            &format!("{field}.devices"),
            o.devices.len(),
            self.max_devices_per_node,
            "max_devices_per_node",
        )?;
        for (i, d) in o.devices.iter().enumerate() {
            self.id(&format!("{field}.devices[{i}].uuid"), &d.uuid)?;
            len(
                &format!("{field}.devices[{i}].shares"),
                &d.shares,
                self.max_slot_value_len,
                "max_slot_value_len",
            )?;
        }
        if let Some(t) = &o.target {
            self.target(&format!("{field}.target"), t)?;
        }
        if let Some(p) = &o.policy {
            self.name(&format!("{field}.policy.memory"), &p.memory)?;
            self.name(&format!("{field}.policy.compute"), &p.compute)?;
        }
        if let Some(c) = &o.claim {
            // Kubernetes names: a namespace is a DNS label, names and UIDs DNS subdomains at most.
            for (name, value) in [
                ("namespace", &c.namespace),
                ("claim_name", &c.claim_name),
                ("claim_uid", &c.claim_uid),
                ("pod_name", &c.pod_name),
                ("pod_uid", &c.pod_uid),
            ] {
                self.id(&format!("{field}.claim.{name}"), value)?;
            }
        }
        self.name(&format!("{field}.class"), &o.class)
    }

    fn running(&self, field: &str, ids: &[String]) -> Result<(), LimitError> {
        many(field, ids.len(), self.max_list_len, "max_list_len")?;
        ids.iter().try_for_each(|id| self.id(field, id))
    }

    /// One message on an agent's stream.
    ///
    /// # Errors
    /// A field over its limit or out of range, named.
    pub fn agent_message(&self, message: &pb::AgentMessage) -> Result<(), LimitError> {
        match &message.msg {
            Some(Msg::Heartbeat(hb)) => {
                self.id("heartbeat.node_id", &hb.node_id)?;
                self.running("heartbeat.running_sessions", &hb.running_sessions)
            }
            Some(Msg::Ack(a)) => self.id("ack.session_id", &a.session_id),
            Some(Msg::Nack(n)) => {
                self.id("nack.session_id", &n.session_id)?;
                self.name("nack.reason", &n.reason)?;
                self.text("nack.message", &n.message)
            }
            Some(Msg::Event(e)) => {
                self.id("event.session_id", &e.session_id)?;
                self.name("event.action", &e.action)?;
                self.text("event.reason", &e.reason)?;
                self.text("event.container", &e.container)
            }
            Some(Msg::Usage(u)) => {
                self.id("usage.session_id", &u.session_id)?;
                finite("usage.utilization", u.utilization)?;
                finite("usage.ioctls_per_sec", u.ioctls_per_sec)
            }
            Some(Msg::Observed(o)) => self.observed("observed", o),
            None => Ok(()),
        }
    }
}

/// What both services share at run time: the limits and the open Watch streams.
#[derive(Debug, Default)]
pub struct Bounds {
    /// The limits.
    pub limits: Limits,
    /// Open Watch streams per caller, and in total.
    watches: Mutex<(HashMap<String, usize>, usize)>,
    /// Each client's calls.
    clients: Mutex<HashMap<String, Bucket>>,
}

/// Clients whose buckets are kept before full ones (idle clients) are forgotten. Callers are
/// authenticated, so there are no more of them than credentials; this only keeps memory in step
/// with the clients that call.
const CLIENT_BUCKETS: usize = 4_096;

impl Bounds {
    /// Bounds with `limits` and nothing open.
    #[must_use]
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            watches: Mutex::default(),
            clients: Mutex::default(),
        })
    }

    /// Takes one call of `caller` from its bucket.
    ///
    /// # Errors
    /// The caller is over its rate: `RESOURCE_EXHAUSTED`, naming the limits.
    pub fn admit_call(&self, caller: &str) -> Result<(), LimitError> {
        let (rate, burst) = (
            self.limits.client_requests_per_sec,
            self.limits.client_request_burst,
        );
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if clients.len() >= CLIENT_BUCKETS && !clients.contains_key(caller) {
            // A full bucket is what a new one would be: forgetting it changes nothing.
            clients.retain(|_, b| !b.is_full());
        }
        let bucket = clients
            .entry(caller.to_owned())
            .or_insert_with(|| Bucket::new(rate, burst));
        if bucket.take() {
            Ok(())
        } else {
            Err(LimitError::Rate {
                caller: caller.to_owned(),
                rate,
                burst,
            })
        }
    }

    /// Opens a Watch stream for `caller`; the stream holds the returned guard, whose drop
    /// closes it.
    ///
    /// # Errors
    /// The caller's or the total cap is reached.
    pub fn open_watch(self: &Arc<Self>, caller: &str) -> Result<WatchGuard, LimitError> {
        let mut w = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
        let (per_caller, total) = &mut *w;
        if *total >= self.limits.max_watches {
            return Err(LimitError::Exhausted {
                what: "open Watch streams".to_owned(),
                max: self.limits.max_watches,
                key: "max_watches",
            });
        }
        let mine = per_caller.entry(caller.to_owned()).or_default();
        if *mine >= self.limits.max_watches_per_caller {
            return Err(LimitError::Exhausted {
                what: format!("open Watch streams of {caller:?}"),
                max: self.limits.max_watches_per_caller,
                key: "max_watches_per_caller",
            });
        }
        *mine += 1;
        *total += 1;
        Ok(WatchGuard {
            bounds: Arc::clone(self),
            caller: caller.to_owned(),
        })
    }

    /// Open Watch streams in total.
    #[must_use]
    pub fn open_watches(&self) -> usize {
        self.watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
    }
}

/// One open Watch stream; dropping it (the client went away) frees its place.
#[derive(Debug)]
pub struct WatchGuard {
    bounds: Arc<Bounds>,
    caller: String,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let mut w = self
            .bounds
            .watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (per_caller, total) = &mut *w;
        *total = total.saturating_sub(1);
        if let Some(n) = per_caller.get_mut(&self.caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per_caller.remove(&self.caller);
            }
        }
    }
}

/// A token bucket: `burst` calls or messages at once, refilled at `rate` a second.
#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket.
    #[must_use]
    pub fn new(rate: u32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate: f64::from(rate),
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    /// A full bucket for one agent stream under `limits`.
    #[must_use]
    pub fn agent_stream(limits: &Limits) -> Self {
        Self::new(limits.agent_messages_per_sec, limits.agent_message_burst)
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let refill = now.duration_since(self.last).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.last = now;
    }

    /// Takes one token; `false` when the bucket is empty (over its rate).
    pub fn take(&mut self) -> bool {
        self.refill();
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn is_full(&mut self) -> bool {
        self.refill();
        self.tokens >= self.burst
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_counter() {
        for (i, reason) in Refusal::ALL.into_iter().enumerate() {
            assert_eq!(reason as usize, i, "{reason:?} is out of order in ALL");
        }
    }

    #[test]
    fn watch_guards_free_their_place() {
        let bounds = Bounds::new(Limits {
            max_watches_per_caller: 2,
            max_watches: 3,
            ..Limits::default()
        });
        let a1 = bounds.open_watch("a").expect("first");
        let _a2 = bounds.open_watch("a").expect("second");
        let e = bounds.open_watch("a").expect_err("third of a");
        assert!(e.to_string().contains("max_watches_per_caller"), "{e}");
        let _b1 = bounds.open_watch("b").expect("b's first");
        let e = bounds.open_watch("c").expect_err("over the total");
        assert!(e.to_string().contains("limits.max_watches)"), "{e}");
        drop(a1);
        assert_eq!(bounds.open_watches(), 2);
        bounds.open_watch("c").expect("a place was freed");
    }

    #[test]
    fn a_bucket_allows_its_burst_then_refuses() {
        let mut bucket = Bucket::agent_stream(&Limits {
            agent_messages_per_sec: 0,
            agent_message_burst: 3,
            ..Limits::default()
        });
        assert!((0..3).all(|_| bucket.take()));
        assert!(!bucket.take());
    }

    #[test]
    fn each_client_has_its_own_rate_and_idle_ones_are_forgotten() {
        let bounds = Bounds::new(Limits {
            client_requests_per_sec: 0,
            client_request_burst: 2,
            ..Limits::default()
        });
        assert!(bounds.admit_call("a").is_ok() && bounds.admit_call("a").is_ok());
        let e = bounds.admit_call("a").expect_err("a's third call");
        assert_eq!(e.reason(), Refusal::Rate);
        assert_eq!(e.to_status().code(), tonic::Code::ResourceExhausted);
        assert!(
            e.to_string().contains("limits.client_requests_per_sec"),
            "{e}"
        );
        bounds.admit_call("b").expect("b has its own bucket");
        // Thousands of clients that call once and never again do not grow the map without end:
        // refilled at once here, their buckets are full, and full ones are forgotten.
        let bounds = Bounds::new(Limits {
            client_requests_per_sec: u32::MAX,
            ..Limits::default()
        });
        for i in 0..2 * CLIENT_BUCKETS {
            bounds
                .admit_call(&format!("client-{i}"))
                .expect("a first call");
        }
        let kept = bounds
            .clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        assert!(kept <= CLIENT_BUCKETS, "{kept} buckets kept");
    }

    #[test]
    fn observed_sessions_are_bounded_field_by_field() {
        let limits = Limits::default();
        let long = "x".repeat(limits.max_id_len + 1);
        let observed = |claim: pb::KubernetesClaim, devices: usize| pb::ObservedSession {
            session_id: "k8s-a".into(),
            devices: vec![pb::DeviceShare::default(); devices],
            claim: Some(claim),
            ..Default::default()
        };
        let ok = observed(pb::KubernetesClaim::default(), 1);
        let message = |o: pb::ObservedSession| pb::AgentMessage {
            msg: Some(Msg::Observed(o)),
        };
        assert_eq!(limits.agent_message(&message(ok.clone())), Ok(()));
        let e = limits
            .agent_message(&message(observed(
                pb::KubernetesClaim {
                    pod_name: long.clone(),
                    ..Default::default()
                },
                1,
            )))
            .expect_err("refused");
        assert!(e.to_string().starts_with("observed.claim.pod_name:"), "{e}");
        let e = limits
            .agent_message(&message(observed(
                pb::KubernetesClaim::default(),
                limits.max_devices_per_node + 1,
            )))
            .expect_err("refused");
        assert!(e.to_string().starts_with("observed.devices:"), "{e}");
        // At registration: each one named by its place; the node's two GPU lists share a bound.
        let node = |observed: Vec<pb::ObservedSession>, gpus: usize| pb::NodeInfo {
            node_id: "n1".into(),
            devices: vec![pb::Device::default(); gpus],
            kubernetes_devices: vec![pb::Device::default(); gpus],
            observed_sessions: observed,
            ..Default::default()
        };
        assert_eq!(limits.node(&node(vec![ok.clone()], 32)), Ok(()));
        let e = limits.node(&node(vec![], 33)).expect_err("refused");
        assert!(e.to_string().starts_with("devices: 66 entries"), "{e}");
        let mut bad = ok;
        bad.session_id = long;
        let e = limits
            .node(&node(vec![pb::ObservedSession::default(), bad], 1))
            .expect_err("refused");
        assert!(
            e.to_string()
                .starts_with("observed_sessions[1].session_id:"),
            "{e}"
        );
    }

    #[test]
    fn floats_out_of_range_name_their_field() {
        let limits = Limits::default();
        for bad in [f64::NAN, f64::INFINITY, -0.5] {
            let m = pb::AgentMessage {
                msg: Some(Msg::Usage(pb::SessionUsage {
                    session_id: "s".into(),
                    utilization: bad,
                    ..Default::default()
                })),
            };
            let e = limits.agent_message(&m).expect_err("refused");
            assert!(e.to_string().starts_with("usage.utilization"), "{e}");
        }
    }

    #[test]
    fn limits_parse_from_toml_with_defaults() {
        let l: Limits = toml::from_str("max_sessions_per_owner = 5").expect("parses");
        assert_eq!(l.max_sessions_per_owner, 5);
        assert_eq!(l.max_watches, Limits::default().max_watches);
        assert!(toml::from_str::<Limits>("max_everything = 1").is_err());
    }
}
