//! The checks of what clients and agents send, field by field, against [`Limits`]: each
//! refusal names the field and the limit's key. Values are checked before they are parsed
//! further, so an error message never echoes a megabyte back.

use gpuwarden_proto::v1::{self as pb, agent_message::Msg};

use super::{LimitError, Limits};
use crate::slots::SlotName;

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
        self.id("request_id", &r.request_id)?;
        self.slots("requested", r.requested.as_ref())?;
        if let Some(policy) = &r.policy {
            self.name("policy.memory", &policy.memory)?;
            self.name("policy.compute", &policy.compute)?;
        }
        if let Some(t) = &r.target {
            self.target("target", t)?;
        }
        if let Some(gang) = &r.gang {
            self.name("gang.name", &gang.name)?;
            // A gang larger than an owner may have sessions could never be complete.
            let max = u64::try_from(self.max_sessions_per_owner).unwrap_or(u64::MAX);
            if u64::from(gang.size) > max {
                return Err(LimitError::TooLarge {
                    field: "gang.size".to_owned(),
                    value: u64::from(gang.size),
                    max,
                    key: "max_sessions_per_owner",
                });
            }
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
        // Issue 37 §3: one layout per GPU at most, each list within the list bound.
        many(
            "mig_layouts",
            info.mig_layouts.len(),
            self.max_devices_per_node,
            "max_devices_per_node",
        )?;
        for (i, l) in info.mig_layouts.iter().enumerate() {
            self.mig_layout(&format!("mig_layouts[{i}]"), l)?;
        }
        self.running("running_sessions", &info.running_sessions)
    }

    /// One reconfigurable GPU's layout: its UUID, and lists within the list bound.
    fn mig_layout(&self, field: &str, l: &pb::MigLayout) -> Result<(), LimitError> {
        self.id(&format!("{field}.gpu_uuid"), &l.gpu_uuid)?;
        let list = |name: &str, n: usize| many(name, n, self.max_list_len, "max_list_len");
        list(&format!("{field}.occupied"), l.occupied.len())?;
        list(&format!("{field}.profiles"), l.profiles.len())?;
        for (k, p) in l.profiles.iter().enumerate() {
            let at = format!("{field}.profiles[{k}]");
            self.name(&format!("{at}.profile"), &p.profile)?;
            list(&format!("{at}.starts"), p.starts.len())?;
            list(&format!("{at}.free"), p.free.len())?;
        }
        Ok(())
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
        self.id(&format!("{field}.parent_uuid"), &d.parent_uuid)?;
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
