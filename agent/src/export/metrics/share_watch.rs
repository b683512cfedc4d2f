//! Flags a container whose achieved GPU time stays far from its entitlement: below half its
//! share while it runs (so it has work: the contention its share was to protect it from), or
//! above its share by a fifth under `hard` (the ceiling is not holding).
//!
//! The throttle's achieved figure covers about one throttle period and is noisy, so each
//! container's is smoothed (exponentially, over about 20 observations) and a flag is raised only
//! once the smoothed figure has been out of bounds for a whole window (5 minutes by default). A
//! raised flag is an event in the agent's log, the `gpuwarden.container.compute.deviation`
//! metric and, for a container of a session, a `share_deviation` enforcement event sent to the
//! controller (what [`ShareWatch::observe`] returns); it clears as soon as the figure is back in
//! bounds. Prometheus' alerts
//! (`deploy/observability/alerts.yaml`) apply the same bounds to the exported figures.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use gpuwarden_agent_api::{Container, Snapshot};

/// How long a deviation must last before it is flagged.
pub const WINDOW: Duration = Duration::from_mins(5);

/// Weight of each new observation in the smoothed figure.
const ALPHA: f64 = 0.05;

/// Below this a container is taken to be idle (no work), not starved.
const RUNNING: f64 = 0.05;

/// Which way a container is off its entitlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deviation {
    /// It runs, yet gets less than half its share.
    Below,
    /// Its share is hard, yet it gets more than 1.2 × share + 0.05.
    Above,
}

impl Deviation {
    /// Both, in order.
    pub const ALL: [Self; 2] = [Self::Below, Self::Above];

    /// The value of the metric's `gpuwarden.share.deviation` attribute and of the snapshot's
    /// `enforcement.deviation`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Below => "below_entitled",
            Self::Above => "above_hard_share",
        }
    }
}

/// Where `achieved` stands against `entitled` under `policy`.
#[must_use]
pub fn deviation(achieved: f64, entitled: f64, policy: &str) -> Option<Deviation> {
    if achieved > RUNNING && achieved < 0.5 * entitled {
        Some(Deviation::Below)
    } else if policy == "hard" && achieved > 1.2 * entitled + 0.05 {
        Some(Deviation::Above)
    } else {
        None
    }
}

/// A flag raised by [`ShareWatch::observe`] on a session's container: one enforcement event.
#[derive(Debug, Clone, PartialEq)]
pub struct Raised {
    /// The session whose quota the container is under.
    pub session_id: String,
    /// The container's cgroup, relative to the cgroup root.
    pub cgroup_path: String,
    /// Which way it is off.
    pub deviation: Deviation,
    /// Its smoothed achieved share.
    pub achieved: f64,
    /// Its entitled share (the largest over its GPUs).
    pub entitled: f64,
    /// How long it has been off.
    pub lasted: Duration,
}

impl Raised {
    /// The event's reason, in words.
    #[must_use]
    pub fn reason(&self) -> String {
        format!(
            "{}: achieved {:.3} of entitled {:.3} compute share for {:?}",
            self.deviation.as_str(),
            self.achieved,
            self.entitled,
            self.lasted
        )
    }
}

#[derive(Debug)]
struct Watched {
    smoothed: f64,
    /// The deviation under way and since when.
    since: Option<(Deviation, Instant)>,
    /// Whether it was flagged (and logged).
    flagged: bool,
}

/// The smoothed figures and deviations of the containers with a compute share, by cgroup.
#[derive(Debug)]
pub struct ShareWatch {
    window: Duration,
    watched: HashMap<String, Watched>,
}

impl Default for ShareWatch {
    fn default() -> Self {
        Self::new(WINDOW)
    }
}

impl ShareWatch {
    /// Flags deviations that last `window`.
    #[must_use]
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            watched: HashMap::new(),
        }
    }

    /// Takes in one snapshot's figures at `now` and marks each flagged container's
    /// `enforcement.deviation`; logs a flag when raised and when it clears. Returns the flags
    /// raised now on containers of a session (each raised once until it clears).
    pub fn observe(&mut self, snapshot: &mut Snapshot, now: Instant) -> Vec<Raised> {
        let mut raised = Vec::new();
        let mut seen = Vec::new();
        for c in &mut snapshot.containers {
            let Some((achieved, entitled, policy)) = figures(c) else {
                continue;
            };
            seen.push(c.cgroup_path.clone());
            let w = self
                .watched
                .entry(c.cgroup_path.clone())
                .or_insert(Watched {
                    smoothed: achieved,
                    since: None,
                    flagged: false,
                });
            w.smoothed += ALPHA * (achieved - w.smoothed);
            let now_off = deviation(w.smoothed, entitled, &policy);
            match (now_off, w.since) {
                (Some(d), Some((was, _))) if d == was => {}
                (Some(d), _) => {
                    w.since = Some((d, now));
                    w.flagged = false;
                }
                (None, _) => {
                    if w.flagged {
                        tracing::info!(cgroup = %c.cgroup_path, session = ?c.session_id, achieved = w.smoothed, entitled, "compute share back within its entitlement");
                    }
                    w.since = None;
                    w.flagged = false;
                }
            }
            if let Some((d, since)) = w.since
                && now.saturating_duration_since(since) >= self.window
            {
                if !w.flagged {
                    w.flagged = true;
                    tracing::warn!(
                        cgroup = %c.cgroup_path,
                        session = ?c.session_id,
                        achieved = w.smoothed,
                        entitled,
                        policy = %policy,
                        deviation = d.as_str(),
                        "compute share out of its entitlement for {:?}",
                        self.window
                    );
                    if let Some(session_id) = &c.session_id {
                        raised.push(Raised {
                            session_id: session_id.clone(),
                            cgroup_path: c.cgroup_path.clone(),
                            deviation: d,
                            achieved: w.smoothed,
                            entitled,
                            lasted: now.saturating_duration_since(since),
                        });
                    }
                }
                if let Some(e) = c.enforcement.as_mut() {
                    e.deviation = Some(d.as_str().to_owned());
                }
            }
        }
        self.watched.retain(|path, _| seen.contains(path));
        raised
    }
}

/// A container's achieved and entitled share (the largest over its GPUs) and compute policy.
fn figures(c: &Container) -> Option<(f64, f64, String)> {
    let quota = c.quota.as_ref()?;
    let achieved = c.enforcement.as_ref()?.achieved?;
    let entitled = quota.devices.iter().map(|d| d.shares).fold(0.0, f64::max);
    (entitled > 0.0).then(|| (achieved, entitled, quota.compute_policy.clone()))
}

#[cfg(test)]
mod tests {

    use gpuwarden_agent_api::{DeviceQuotaView, EnforcementView, QuotaView};

    use super::*;

    fn snapshot(achieved: f64, share: f64, policy: &str) -> Snapshot {
        Snapshot {
            containers: vec![Container {
                cgroup_path: "/w".into(),
                quota: Some(QuotaView {
                    memory_bytes: 0,
                    shares: share,
                    policy: "kill".into(),
                    compute_policy: policy.into(),
                    devices: vec![DeviceQuotaView {
                        device: "nvidia0".into(),
                        memory_bytes: 0,
                        used_bytes: 0,
                        shares: share,
                    }],
                }),
                enforcement: Some(EnforcementView {
                    tier: "t".into(),
                    actions: 0,
                    denied_opens: 0,
                    throttled_ms: 0,
                    frozen: false,
                    achieved: Some(achieved),
                    deviation: None,
                    gpu_time_ms: 0,
                    ledger_ms: None,
                }),
                ..Container::default()
            }],
            ..Snapshot::default()
        }
    }

    /// Feeds `achieved` once a second for `secs` seconds from `start`; the deviation marked at
    /// the end.
    fn run(
        watch: &mut ShareWatch,
        start: Instant,
        secs: u64,
        achieved: f64,
        share: f64,
        policy: &str,
    ) -> Option<String> {
        let mut last = None;
        for i in 0..secs {
            let mut s = snapshot(achieved, share, policy);
            watch.observe(&mut s, start + Duration::from_secs(i));
            last = s.containers[0]
                .enforcement
                .as_ref()
                .unwrap()
                .deviation
                .clone();
        }
        last
    }

    #[test]
    fn bounds() {
        assert_eq!(
            deviation(0.2, 0.5, "work-conserving"),
            Some(Deviation::Below)
        );
        assert_eq!(deviation(0.01, 0.5, "hard"), None, "idle is not starved");
        assert_eq!(deviation(0.3, 0.5, "hard"), None);
        assert_eq!(deviation(0.9, 0.3, "hard"), Some(Deviation::Above));
        assert_eq!(deviation(0.9, 0.3, "work-conserving"), None, "borrowing");
        assert_eq!(deviation(0.4, 0.3, "hard"), None, "within the margin");
    }

    #[test]
    fn a_deviation_is_flagged_only_after_the_window_and_clears_at_once() {
        let t0 = Instant::now();
        let mut watch = ShareWatch::new(Duration::from_mins(1));
        assert_eq!(run(&mut watch, t0, 50, 0.2, 0.5, "hard"), None);
        assert_eq!(
            run(
                &mut watch,
                t0 + Duration::from_secs(50),
                20,
                0.2,
                0.5,
                "hard"
            )
            .as_deref(),
            Some("below_entitled")
        );
        // Back to its share: the smoothed figure crosses back within a few dozen seconds.
        assert_eq!(
            run(
                &mut watch,
                t0 + Duration::from_secs(70),
                60,
                0.5,
                0.5,
                "hard"
            ),
            None
        );
        let mut hard = ShareWatch::new(Duration::from_mins(1));
        assert_eq!(
            run(&mut hard, t0, 80, 0.9, 0.3, "hard").as_deref(),
            Some("above_hard_share")
        );
        let mut borrowing = ShareWatch::new(Duration::from_mins(1));
        assert_eq!(
            run(&mut borrowing, t0, 80, 0.9, 0.3, "work-conserving"),
            None
        );
    }

    #[test]
    fn one_noisy_reading_does_not_flag_or_reset() {
        let t0 = Instant::now();
        let mut watch = ShareWatch::new(Duration::from_secs(30));
        // Mostly at its share with one reading of 0.1: never flagged.
        for i in 0..60 {
            let a = if i == 10 { 0.1 } else { 0.5 };
            let mut s = snapshot(a, 0.5, "hard");
            watch.observe(&mut s, t0 + Duration::from_secs(i));
            assert_eq!(
                s.containers[0].enforcement.as_ref().unwrap().deviation,
                None
            );
        }
    }

    #[test]
    fn a_raised_flag_is_one_event_for_its_session_until_it_clears() {
        let t0 = Instant::now();
        let mut watch = ShareWatch::new(Duration::from_secs(30));
        let feed = |watch: &mut ShareWatch, from: u64, secs: u64, achieved: f64| {
            let mut events = Vec::new();
            for i in from..from + secs {
                let mut s = snapshot(achieved, 0.5, "hard");
                s.containers[0].session_id = Some("s-1".into());
                events.extend(watch.observe(&mut s, t0 + Duration::from_secs(i)));
            }
            events
        };
        // Starved for 90 s: one event, once the window has passed, however long it lasts.
        let events = feed(&mut watch, 0, 90, 0.1);
        assert_eq!(events.len(), 1, "{events:?}");
        let e = &events[0];
        assert_eq!(e.session_id, "s-1");
        assert_eq!(e.cgroup_path, "/w");
        assert_eq!(e.deviation, Deviation::Below);
        assert!((e.entitled - 0.5).abs() < 1e-12, "{e:?}");
        assert!(e.achieved < 0.25, "{e:?}");
        assert!(e.lasted >= Duration::from_secs(30), "{e:?}");
        assert!(
            e.reason().starts_with("below_entitled: achieved 0."),
            "{}",
            e.reason()
        );
        // Back within bounds, then starved again: a second event.
        assert!(feed(&mut watch, 90, 120, 0.5).is_empty());
        let again = feed(&mut watch, 210, 120, 0.1);
        assert_eq!(again.len(), 1, "{again:?}");
        // A container of no session is flagged in the metrics only.
        let mut alone = ShareWatch::new(Duration::from_secs(30));
        for i in 0..90 {
            let raised =
                alone.observe(&mut snapshot(0.1, 0.5, "hard"), t0 + Duration::from_secs(i));
            assert!(raised.is_empty(), "{raised:?}");
        }
    }

    #[test]
    fn containers_that_are_gone_are_forgotten() {
        let mut watch = ShareWatch::default();
        watch.observe(&mut snapshot(0.2, 0.5, "hard"), Instant::now());
        assert_eq!(watch.watched.len(), 1);
        watch.observe(&mut Snapshot::default(), Instant::now());
        assert!(watch.watched.is_empty());
    }
}
