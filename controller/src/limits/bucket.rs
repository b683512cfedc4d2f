//! [`Bucket`]: the token bucket that holds a client's calls and an agent stream's messages to
//! their rate.

use std::time::Instant;

use super::Limits;

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

    pub(super) fn is_full(&mut self) -> bool {
        self.refill();
        self.tokens >= self.burst
    }
}
