//! The webhook's memory of the claim templates it made: a pod whose template is known costs no
//! API call, and new templates are made at a bounded rate, cluster-wide and per namespace (one
//! namespace's flood leaves the others their budget), so that a flood of `AdmissionReviews`
//! (anyone who reaches the webhook's port can send them) can neither flood the API server nor
//! fill namespaces with templates of every memory size.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::apiserver::{ApiError, BoxFuture, ClaimTemplates, Ensured};
use crate::limits::Bucket;

/// How long a template is taken to exist without asking again (one deleted by hand is made
/// again after this).
const REMEMBERED_FOR: Duration = Duration::from_mins(5);
/// Templates remembered at most; past it the memory starts over.
const REMEMBERED: usize = 4_096;
/// New templates made per second, sustained.
const NEW_PER_SEC: u32 = 5;
/// New templates made in a burst.
const NEW_BURST: u32 = 50;
/// New templates made per second in one namespace, sustained: one namespace's flood takes at
/// most this share of [`NEW_PER_SEC`], so the others still get theirs.
const NEW_PER_SEC_PER_NAMESPACE: u32 = 1;
/// New templates made in a burst in one namespace.
const NEW_BURST_PER_NAMESPACE: u32 = 10;
/// Namespaces whose budgets are remembered; past it they start over (the cluster-wide bucket
/// still holds).
const NAMESPACES: usize = 4_096;

/// [`ClaimTemplates`] in front of another: remembers what exists, bounds what is made.
pub struct Remembered {
    inner: Arc<dyn ClaimTemplates>,
    known: Mutex<HashMap<(String, String), Instant>>,
    new: Mutex<Bucket>,
    per_namespace: Mutex<HashMap<String, Bucket>>,
    namespace_rate: (u32, u32),
}

impl Remembered {
    /// In front of `inner`, with the default bounds.
    #[must_use]
    pub fn new(inner: Arc<dyn ClaimTemplates>) -> Self {
        Self::with_rate(inner, NEW_PER_SEC, NEW_BURST)
    }

    /// In front of `inner`, making at most `per_sec` new templates a second with bursts of
    /// `burst`.
    #[must_use]
    pub fn with_rate(inner: Arc<dyn ClaimTemplates>, per_sec: u32, burst: u32) -> Self {
        Self::with_rates(
            inner,
            (per_sec, burst),
            (NEW_PER_SEC_PER_NAMESPACE, NEW_BURST_PER_NAMESPACE),
        )
    }

    /// In front of `inner`, making at most `cluster` = (per second, burst) new templates over
    /// all namespaces and `namespace` = (per second, burst) in any one.
    #[must_use]
    pub fn with_rates(
        inner: Arc<dyn ClaimTemplates>,
        cluster: (u32, u32),
        namespace: (u32, u32),
    ) -> Self {
        Self {
            inner,
            known: Mutex::default(),
            new: Mutex::new(Bucket::new(cluster.0, cluster.1)),
            per_namespace: Mutex::default(),
            namespace_rate: namespace,
        }
    }

    /// Takes one new template from `namespace`'s budget.
    fn namespace_allows(&self, namespace: &str) -> bool {
        let mut buckets = self.per_namespace.locked();
        if !buckets.contains_key(namespace) && buckets.len() >= NAMESPACES {
            buckets.clear();
        }
        let (per_sec, burst) = self.namespace_rate;
        buckets
            .entry(namespace.to_owned())
            .or_insert_with(|| Bucket::new(per_sec, burst))
            .take()
    }

    fn key(namespace: &str, template: &Value) -> (String, String) {
        let name = template
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        (namespace.to_owned(), name.to_owned())
    }
}

impl ClaimTemplates for Remembered {
    fn ensure<'a>(
        &'a self,
        namespace: &'a str,
        template: &'a Value,
    ) -> BoxFuture<'a, Result<Ensured, ApiError>> {
        Box::pin(async move {
            let key = Self::key(namespace, template);
            {
                let known = self.known.locked();
                if known
                    .get(&key)
                    .is_some_and(|at| at.elapsed() < REMEMBERED_FOR)
                {
                    return Ok(Ensured::Existed);
                }
            }
            if !self.namespace_allows(namespace) {
                return Err(ApiError::Throttled {
                    per_sec: self.namespace_rate.0,
                });
            }
            if !self.new.locked().take() {
                return Err(ApiError::Throttled {
                    per_sec: NEW_PER_SEC,
                });
            }
            let ensured = self.inner.ensure(namespace, template).await?;
            let mut known = self.known.locked();
            if known.len() >= REMEMBERED {
                known.clear();
            }
            known.insert(key, Instant::now());
            Ok(ensured)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde_json::json;

    use super::*;

    /// Counts the calls that reach the API server.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl ClaimTemplates for Counting {
        fn ensure<'a>(
            &'a self,
            _: &'a str,
            _: &'a Value,
        ) -> BoxFuture<'a, Result<Ensured, ApiError>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Box::pin(async { Ok(Ensured::Created) })
        }
    }

    fn template(name: &str) -> Value {
        json!({ "metadata": { "name": name } })
    }

    #[tokio::test]
    async fn known_templates_cost_no_call_and_new_ones_are_bounded() {
        let api = Arc::new(Counting::default());
        let remembered = Remembered::with_rate(api.clone(), 0, 3);
        for _ in 0..10 {
            let ensured = remembered
                .ensure("ml", &template("gpuwarden-0.5-8gi"))
                .await
                .expect("made once, then remembered");
            assert!(matches!(ensured, Ensured::Created | Ensured::Existed));
        }
        assert_eq!(api.0.load(Ordering::Relaxed), 1);
        // The same name in another namespace is another template.
        remembered
            .ensure("other", &template("gpuwarden-0.5-8gi"))
            .await
            .expect("made");
        remembered
            .ensure("ml", &template("gpuwarden-0.5-9gi"))
            .await
            .expect("made");
        // The burst of three is spent: a fourth new template is refused, a known one is not.
        let e = remembered
            .ensure("ml", &template("gpuwarden-0.5-10gi"))
            .await
            .expect_err("past the rate");
        assert!(e.to_string().contains("new claim templates"), "{e}");
        remembered
            .ensure("ml", &template("gpuwarden-0.5-8gi"))
            .await
            .expect("still known");
        assert_eq!(api.0.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn one_namespace_spends_only_its_own_budget() {
        let api = Arc::new(Counting::default());
        let remembered = Remembered::with_rates(api.clone(), (0, 10), (0, 2));
        for i in 0..2 {
            remembered
                .ensure("flood", &template(&format!("gpuwarden-0.5-{i}gi")))
                .await
                .expect("within the namespace's burst");
        }
        for i in 2..20 {
            remembered
                .ensure("flood", &template(&format!("gpuwarden-0.5-{i}gi")))
                .await
                .expect_err("past the namespace's burst");
        }
        // The flood took two of the cluster's ten: another namespace still gets its own.
        for i in 0..2 {
            remembered
                .ensure("quiet", &template(&format!("gpuwarden-0.5-{i}gi")))
                .await
                .expect("its own budget is whole");
        }
        assert_eq!(api.0.load(Ordering::Relaxed), 4);
    }
}
