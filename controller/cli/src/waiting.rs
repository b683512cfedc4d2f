//! Waiting for a session to run (`gpuwarden run`, `session create --wait`), and saying what it
//! waits for: the controller's reason (as `session show` gives it), again whenever it changes,
//! with the time waited so far.
//!
//! On a terminal that is one status line, redrawn in place with a spinner and cleared when the
//! wait ends; in a pipe, or with `--json`, one plain line on stderr per change, so a log keeps
//! every reason and stdout stays the command's.

use std::{
    io::{IsTerminal as _, Write as _},
    time::Duration,
};

use gpuwarden_proto::v1 as pb;
use gpuwarden_types::units::fit;
use tokio::time::Instant;

use super::{CliError, Client, ControllerArgs, follow, wire};

/// How often the wait is looked at again: the terminal's status line redrawn (the spinner
/// turns, the seconds count), a wait past [`GRACE`] said.
const TICK: Duration = Duration::from_millis(100);
/// How long a wait with no reason goes unsaid.
const GRACE: Duration = Duration::from_secs(1);
/// How often the session is read as well as watched: a reason may change without its state.
const POLL: Duration = Duration::from_secs(1);
/// The spinner's frames.
const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// How the wait is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// One status line redrawn in place (stderr is a terminal).
    StatusLine,
    /// A plain line per change (a pipe, a file, or `--json`).
    Lines,
}

impl Style {
    /// A status line when stderr is a terminal and no JSON was asked for; plain lines otherwise.
    #[must_use]
    pub fn detect(json: bool) -> Self {
        if !json && std::io::stderr().is_terminal() {
            Self::StatusLine
        } else {
            Self::Lines
        }
    }
}

/// What a wait has said so far, and the terminal line it keeps drawn.
struct Progress {
    style: Style,
    started: Instant,
    /// The last `(state, reason)` said, so each change is said once.
    said: Option<(i32, String)>,
    /// What the session waits for: `pending: no node fits cuda.shares=0.5`.
    why: String,
    /// The session.
    id: String,
    frame: usize,
    /// Whether a status line is on the terminal now (to clear it when the wait ends).
    drawn: bool,
}

impl Progress {
    fn new(style: Style) -> Self {
        Self {
            style,
            started: Instant::now(),
            said: None,
            why: String::new(),
            id: String::new(),
            frame: 0,
            drawn: false,
        }
    }

    /// Says the session's state and reason if they changed since last said (a plain line), or
    /// redraws the status line. A wait the controller gives no reason for is said only once it
    /// lasts [`GRACE`]: a session placed at once starts without a word.
    fn update(&mut self, s: &pb::Session) {
        if s.reason.is_empty() && self.started.elapsed() < GRACE {
            return;
        }
        let now = (s.state, s.reason.clone());
        if self.said.as_ref() != Some(&now) {
            self.said = Some(now);
            self.why = waiting_for(s);
            self.id.clone_from(&s.id);
            if self.style == Style::Lines {
                eprintln!(
                    "gpuwarden: session {} {} ({} waited)",
                    self.id,
                    self.why,
                    elapsed(self.started.elapsed())
                );
            }
        }
        if self.style == Style::StatusLine {
            self.frame = (self.frame + 1) % SPINNER.len();
            self.draw();
        }
    }

    fn draw(&mut self) {
        // The reason first: a narrow terminal cuts the id rather than the reason.
        let line = format!(
            "{} {} {} (session {})",
            SPINNER[self.frame],
            elapsed(self.started.elapsed()),
            self.why,
            self.id
        );
        // A line wider than the terminal would wrap, and erasing the line would leave the
        // rows above it behind.
        let line = match terminal_width() {
            Some(width) => fit(&line, width.saturating_sub(1)),
            None => line,
        };
        let mut err = std::io::stderr().lock();
        // Carriage return and erase-line: the line is rewritten where it stands.
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
        self.drawn = true;
    }
}

impl Drop for Progress {
    /// Clears the status line, however the wait ended (started, failed, interrupted).
    fn drop(&mut self) {
        if self.drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

/// The width of the terminal on stderr, in columns (`None`: not a terminal, or it won't say).
fn terminal_width() -> Option<usize> {
    // SAFETY: `winsize` is plain data, for which all zeroes is a valid value.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which points at one.
    let got = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &raw mut size) };
    (got == 0 && size.ws_col > 0).then_some(usize::from(size.ws_col))
}

/// What a session not yet running waits for, in words: its state and why.
fn waiting_for(s: &pb::Session) -> String {
    let state = wire::state(s.state);
    let why = match (
        s.reason.is_empty(),
        s.state == pb::SessionState::Scheduled as i32,
    ) {
        (false, _) => s.reason.clone(),
        (true, true) => format!("placed on {}, waiting for its agent", s.node_id),
        (true, false) => "waiting for the scheduler".to_owned(),
    };
    format!("{state}: {why}")
}

/// A time waited as people read it: `7s`, `2m05s`.
fn elapsed(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        format!("{secs}s")
    } else {
        format!("{}m{:02}s", secs / 60, secs % 60)
    }
}

/// Waits until session `id` runs, saying in `style` what it waits for: its state now, then
/// every change of it after the revision the sessions were at when it was read (the session was
/// created, and stored, before), and a read of it every [`POLL`]. The session as it runs.
///
/// # Errors
/// [`CliError::TimedOut`] after `timeout` (the session is left as it is: the caller decides);
/// [`CliError::Run`] once it can no longer run (failed or ended); the controller's errors.
pub async fn wait_running(
    controller: &ControllerArgs,
    client: &mut Client,
    id: &str,
    timeout: Duration,
    style: Style,
) -> Result<pb::Session, CliError> {
    let deadline = Instant::now() + timeout;
    let revision = follow::revision_now(client).await?;
    let mut s = client
        .get_session(pb::GetSessionRequest { id: id.to_owned() })
        .await?
        .into_inner();
    let mut watch = Watch::start(controller.clone(), client.clone(), revision);
    let mut progress = Progress::new(style);
    let mut tick = tokio::time::interval(TICK);
    let mut poll = tokio::time::interval(POLL);
    loop {
        if started(id, &s)? {
            return Ok(s);
        }
        progress.update(&s);
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {
                return Err(CliError::TimedOut {
                    id: id.to_owned(),
                    waited: elapsed(timeout),
                    state: wire::state(s.state).to_owned(),
                    reason: s.reason,
                });
            }
            next = watch.changes.recv() => {
                // Another session's change, or an older state of this one, says nothing new.
                let Some(next) = next else {
                    return Err(CliError::Run("the session watch ended".to_owned()));
                };
                let next = next?;
                if next.id == id && next.revision >= s.revision {
                    s = next;
                }
            }
            _ = poll.tick() => {
                // A read that fails is left to the watch, which reconnects; one that hangs
                // doesn't outlast the deadline.
                let read = client.get_session(pb::GetSessionRequest { id: id.to_owned() });
                if let Ok(Ok(now)) = tokio::time::timeout_at(deadline, read).await {
                    let now = now.into_inner();
                    if now.revision >= s.revision {
                        s = now;
                    }
                }
            }
            // The status line's spinner and seconds; a wait outlasting GRACE.
            _ = tick.tick() => {}
        }
    }
}

/// The sessions' changes after a revision, followed on a task of its own (stopped when this is
/// dropped): the wait's timers then never cancel a watch half-opened or a reconnection
/// half-way through its back-off.
struct Watch {
    changes: tokio::sync::mpsc::Receiver<Result<pb::Session, CliError>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    fn start(controller: ControllerArgs, client: Client, revision: u64) -> Self {
        let (tx, changes) = tokio::sync::mpsc::channel(16);
        let task = tokio::spawn(async move {
            let mut follower = follow::Follower::new(&controller, client, revision);
            loop {
                let next = follower.next().await;
                let failed = next.is_err();
                if tx.send(next).await.is_err() || failed {
                    return;
                }
            }
        });
        Self { changes, task }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether session `s` runs (`false`: not yet); an error once it can no longer.
fn started(id: &str, s: &pb::Session) -> Result<bool, CliError> {
    match pb::SessionState::try_from(s.state).unwrap_or(pb::SessionState::Unspecified) {
        pb::SessionState::Running => Ok(true),
        // Suspended: it waits to resume where it ran (issue 38).
        pb::SessionState::Pending
        | pb::SessionState::Scheduled
        | pb::SessionState::Suspended
        | pb::SessionState::Unspecified => Ok(false),
        pb::SessionState::Failed => {
            Err(CliError::Run(format!("session {id} failed: {}", s.reason)))
        }
        pb::SessionState::Terminating
        | pb::SessionState::Terminated
        | pb::SessionState::Lost
        | pb::SessionState::Preempted => Err(CliError::Run(format!(
            "session {id} ended before it ran ({}){}",
            wire::state(s.state),
            if s.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", s.reason)
            }
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(reason: &str) -> pb::Session {
        pb::Session {
            id: "s-1".into(),
            state: pb::SessionState::Pending as i32,
            reason: reason.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_wait_is_said_in_the_controllers_words() {
        assert_eq!(
            waiting_for(&pending("no node fits cuda.shares=0.5")),
            "pending: no node fits cuda.shares=0.5"
        );
        assert_eq!(
            waiting_for(&pending("")),
            "pending: waiting for the scheduler"
        );
        let placed = pb::Session {
            state: pb::SessionState::Scheduled as i32,
            node_id: "n1".into(),
            ..pending("")
        };
        assert_eq!(
            waiting_for(&placed),
            "scheduled: placed on n1, waiting for its agent"
        );
    }

    #[test]
    fn times_read_in_seconds_then_minutes() {
        assert_eq!(elapsed(Duration::from_millis(7_900)), "7s");
        assert_eq!(elapsed(Duration::from_secs(125)), "2m05s");
    }

    #[test]
    fn each_change_is_said_once_and_a_wait_without_reason_only_past_the_grace() {
        let mut p = Progress::new(Style::Lines);
        p.update(&pending(""));
        assert_eq!(
            p.said, None,
            "a session placed at once starts without a word"
        );
        p.update(&pending("a"));
        let first = p.said.clone();
        p.update(&pending("a"));
        assert_eq!(p.said, first);
        p.update(&pending("b"));
        assert_eq!(p.said, Some((pb::SessionState::Pending as i32, "b".into())));
    }
}
