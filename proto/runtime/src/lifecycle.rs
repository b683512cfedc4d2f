//! The one lifecycle both daemons share (docs/architecture.md, "Lifecycle"): a configuration is
//! *built* into an app (ports bound, stores opened, programs loaded: everything that can fail),
//! the app is *spawned* into running tasks, and the running daemon is *shut down* by stopping
//! and joining those tasks in reverse start order.
//!
//! The teardown is data: [`Tasks`] holds each started task with how it stops, in the order they
//! started, so no hand-written sequence can fall out of step with the start-up. [`Stop`] is the
//! one stop signal a daemon's tasks share.

use std::{future::Future, pin::Pin};

use tokio::{
    sync::watch,
    task::{JoinError, JoinHandle},
};

/// A task that panicked (or was cancelled when it should have ended by itself).
#[derive(Debug, thiserror::Error)]
#[error("the {task} task ended abnormally: {source}")]
pub struct TaskError {
    /// Which task.
    pub task: &'static str,
    /// Why.
    #[source]
    pub source: JoinError,
}

/// What a task's output says about how it ended: `()` always ended well; a `Result` says.
pub trait Ended<E> {
    /// The output as a result.
    ///
    /// # Errors
    /// The task failed.
    fn ended(self) -> Result<(), E>;
}

impl<E> Ended<E> for () {
    fn ended(self) -> Result<(), E> {
        Ok(())
    }
}

impl<E> Ended<E> for Result<(), E> {
    fn ended(self) -> Result<(), E> {
        self
    }
}

/// A future that stops one started part and says how it ended.
type Stopping<E> = Pin<Box<dyn Future<Output = Result<(), E>> + Send>>;

/// Stops one started part.
type Stopper<E> = Box<dyn FnOnce() -> Stopping<E> + Send>;

/// The tasks a daemon started, each with how it stops, in start order; [`Tasks::shutdown`] stops
/// and joins them last-started first, so a task is stopped before anything it uses.
pub struct Tasks<E> {
    started: Vec<(&'static str, Stopper<E>)>,
}

impl<E> Default for Tasks<E> {
    fn default() -> Self {
        Self {
            started: Vec::new(),
        }
    }
}

impl<E> std::fmt::Debug for Tasks<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl<E: From<TaskError> + Send + 'static> Tasks<E> {
    /// A task that runs until cancelled: aborted on the way down (what it returned, if it ended
    /// first, is kept).
    pub fn abort<T: Ended<E> + Send + 'static>(
        &mut self,
        task: &'static str,
        handle: JoinHandle<T>,
    ) {
        self.started.push((
            task,
            Box::new(move || {
                handle.abort();
                Box::pin(async move {
                    match handle.await {
                        Ok(output) => output.ended(),
                        Err(e) if e.is_cancelled() => Ok(()),
                        Err(source) => Err(TaskError { task, source }.into()),
                    }
                })
            }),
        ));
    }

    /// A task that ends when told: `stop` tells it, then it is awaited to its end.
    pub fn stop_with<T: Ended<E> + Send + 'static>(
        &mut self,
        task: &'static str,
        handle: JoinHandle<T>,
        stop: impl FnOnce() + Send + 'static,
    ) {
        self.started.push((
            task,
            Box::new(move || {
                stop();
                Box::pin(async move {
                    match handle.await {
                        Ok(output) => output.ended(),
                        Err(source) => Err(TaskError { task, source }.into()),
                    }
                })
            }),
        ));
    }

    /// A part that is no task of this runtime (a thread behind a handle, a pipeline): `stop`
    /// stops it.
    pub fn stop_by<F>(&mut self, task: &'static str, stop: impl FnOnce() -> F + Send + 'static)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        self.started
            .push((task, Box::new(move || Box::pin(stop()) as Stopping<E>)));
    }

    /// Stops and joins every task, the last started first. Each is stopped even when one before
    /// it failed; the first failure is returned.
    ///
    /// # Errors
    /// A task failed, panicked, or was cancelled before it was told to stop.
    pub async fn shutdown(mut self) -> Result<(), E> {
        let mut result = Ok(());
        while let Some((task, stop)) = self.started.pop() {
            tracing::debug!(task, "stopping");
            let ended = stop().await;
            if ended.is_err() {
                tracing::debug!(task, "ended abnormally");
            }
            result = result.and(ended);
        }
        result
    }
}

impl<E> Tasks<E> {
    /// The tasks' names, in start order (shutdown runs them backwards).
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.started.iter().map(|(task, _)| *task)
    }
}

/// The one stop signal a daemon's tasks share: set once (by the daemon's stop, or by a task that
/// ended by itself), seen by every copy of [`Stop::stopped`].
#[derive(Debug, Clone)]
pub struct Stop(watch::Sender<bool>);

impl Default for Stop {
    fn default() -> Self {
        Self(watch::channel(false).0)
    }
}

impl Stop {
    /// Sets it: every [`Stop::stopped`] completes.
    pub fn stop(&self) {
        self.0.send_replace(true);
    }

    /// Completes once [`Stop::stop`] was called (at once if it was already).
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stopped = self.0.subscribe();
        async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Failed {
        #[error(transparent)]
        Task(#[from] TaskError),
        #[error("{0} failed")]
        Own(&'static str),
    }

    /// Records the order in which parts stop.
    fn recorder() -> (Arc<Mutex<Vec<&'static str>>>, impl Fn(&'static str) + Clone) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let held = Arc::clone(&log);
        (log, move |name| held.lock().unwrap().push(name))
    }

    #[tokio::test]
    async fn stops_in_reverse_start_order_and_joins_every_kind() {
        let (log, record) = recorder();
        let mut tasks = Tasks::<Failed>::default();
        let r = record.clone();
        tasks.stop_by("first", move || async move {
            r("first");
            Ok(())
        });
        let stop = Stop::default();
        let stopped = stop.stopped();
        let r = record.clone();
        let signalled = tokio::spawn(async move {
            stopped.await;
            r("second");
        });
        tasks.stop_with("second", signalled, move || stop.stop());
        let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<()>();
        let forever = tokio::spawn(async move {
            let _held = dropped_tx;
            std::future::pending::<()>().await;
        });
        tasks.abort("third", forever);
        assert_eq!(
            tasks.names().collect::<Vec<_>>(),
            ["first", "second", "third"]
        );
        tasks.shutdown().await.unwrap();
        // The aborted task dropped what it held: the channel's sender is gone.
        assert!(dropped_rx.await.is_err());
        assert_eq!(*log.lock().unwrap(), ["second", "first"]);
    }

    async fn panics() {
        tokio::task::yield_now().await;
        panic!("on purpose");
    }

    #[tokio::test]
    async fn a_failure_is_returned_and_the_rest_still_stop() {
        let (log, record) = recorder();
        let mut tasks = Tasks::<Failed>::default();
        let r = record.clone();
        tasks.stop_by("store", move || async move {
            r("store");
            Ok(())
        });
        tasks.stop_with(
            "server",
            tokio::spawn(async { Err::<(), _>(Failed::Own("server")) }),
            || {},
        );
        tasks.abort("panics", tokio::spawn(panics()));
        // Let the panicking task run before it is aborted.
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let e = tasks.shutdown().await.unwrap_err();
        assert!(
            matches!(e, Failed::Task(TaskError { task: "panics", .. })),
            "{e}"
        );
        assert_eq!(*log.lock().unwrap(), ["store"]);
    }

    #[tokio::test]
    async fn stop_is_seen_by_copies_made_before_and_after() {
        let stop = Stop::default();
        let before = stop.stopped();
        stop.clone().stop();
        tokio::time::timeout(std::time::Duration::from_secs(1), before)
            .await
            .unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(1), stop.stopped())
            .await
            .unwrap();
    }
}
