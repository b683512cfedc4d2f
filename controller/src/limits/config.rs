//! [`Limits`]: every bound with its default, as the `[limits]` table of the controller's config
//! file overrides them, and the check that a file's values leave traffic possible.

use std::time::Duration;

use serde::Deserialize;

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
}
