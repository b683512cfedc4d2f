//! Ended sessions are kept for a while, so that `session show` and a watcher that reconnects
//! still find how they ended, then forgotten: without this a long-lived controller's memory and
//! store grow with every session it ever ran. Their workload profiles were learned when they
//! ended and stay.

use serde::{Deserialize, Serialize};

use super::Scheduler;

/// How long ended sessions are kept. Config: `[scheduler.retention]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Retention {
    /// Seconds an ended (terminated or failed) session is kept after it ended (one day).
    pub ended_secs: u64,
    /// Most ended sessions kept, the most recently ended first (10,000).
    pub max_ended: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            ended_secs: 24 * 60 * 60,
            max_ended: 10_000,
        }
    }
}

impl Scheduler {
    /// Forgets ended sessions older than the retention, or beyond the most kept, the oldest
    /// first; returns how many. They leave the store with the next commit.
    pub fn forget_ended(&mut self, now_ms: i64) -> usize {
        let Retention {
            ended_secs,
            max_ended,
        } = self.config.retention;
        let cutoff = now_ms
            .saturating_sub(i64::try_from(ended_secs.saturating_mul(1_000)).unwrap_or(i64::MAX));
        let mut ended: Vec<(i64, String)> = self
            .sessions
            .values()
            .filter(|s| s.state.is_final())
            .map(|s| (s.updated_at_ms, s.id.clone()))
            .collect();
        // Newest first: the first `max_ended` of those still within the retention are kept.
        ended.sort_unstable_by(|a, b| b.cmp(a));
        let forget: Vec<String> = ended
            .into_iter()
            .enumerate()
            .filter(|(i, (ended_at, _))| *i >= max_ended || *ended_at < cutoff)
            .map(|(_, (_, id))| id)
            .collect();
        for id in &forget {
            if let Some(s) = self.sessions.remove(id) {
                self.leave_gang(&s);
                self.forget_request(&s);
            }
            self.changes.sessions.insert(id.clone());
        }
        forget.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        node::NodeReport,
        scheduler::{NewSession, SchedulerConfig},
        session::SessionState,
        slots::ResourceSlot,
    };

    fn scheduler(retention: Retention) -> Scheduler {
        let mut s = Scheduler::new(SchedulerConfig {
            retention,
            ..SchedulerConfig::default()
        });
        s.register(NodeReport::with_gpus("n1", 8, 80 << 30, 8), &[])
            .expect("registers");
        s
    }

    /// Creates, places and ends `id`, as of `at_ms`.
    fn ended(s: &mut Scheduler, id: &str, at_ms: i64) {
        s.create(NewSession {
            id: id.into(),
            requested: ResourceSlot::parse_any(&["cuda.shares=0.1"]).expect("valid"),
            ..NewSession::default()
        })
        .expect("created");
        s.terminate_released(id);
        s.sessions.get_mut(id).expect("kept").updated_at_ms = at_ms;
    }

    #[test]
    fn ended_sessions_go_after_the_retention_and_past_the_most_kept() {
        let mut s = scheduler(Retention {
            ended_secs: 60,
            max_ended: 2,
        });
        let now = 1_000_000_000;
        ended(&mut s, "old", now - 61_000);
        ended(&mut s, "a", now - 30_000);
        ended(&mut s, "b", now - 20_000);
        ended(&mut s, "c", now - 10_000);
        s.create(NewSession {
            id: "live".into(),
            requested: ResourceSlot::parse_any(&["cuda.shares=0.1"]).expect("valid"),
            ..NewSession::default()
        })
        .expect("created");
        s.take_changes();

        // "old" is past the retention; "a" is the oldest of three within it, one more than kept.
        assert_eq!(s.forget_ended(now), 2);
        let kept: Vec<_> = s.sessions().keys().cloned().collect();
        assert_eq!(kept, ["b", "c", "live"]);
        let changed = s.take_changes().sessions;
        assert!(
            changed.contains("old") && changed.contains("a"),
            "{changed:?}"
        );
        assert_eq!(s.sessions()["live"].state, SessionState::Pending);
        // Nothing more to forget.
        assert_eq!(s.forget_ended(now), 0);
    }
}
