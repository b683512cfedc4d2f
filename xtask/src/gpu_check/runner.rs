//! Sections run under deadlines, and rows that are never lost.
//!
//! The whole run is planned up front: every section names its sub-checks before it starts. A
//! row is printed and appended to the results file the moment it is made ([`Sink::emit`]).
//! Each section runs on its own thread under its own deadline; when it fails or its deadline
//! passes, each sub-check it did not reach still gets its row, a FAIL saying why, its processes
//! are killed and the run goes on. A watchdog holds the whole run to its deadline: when that
//! passes it fills in every missing row, prints the table, kills every child and exits.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::BTreeSet,
    fs::File,
    io::Write as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use super::{Row, Verdict, procs, render};

/// Where rows go: the terminal, the results file, and the table at the end.
pub struct Sink {
    title: String,
    plan: Vec<(String, String)>,
    rows: Mutex<Vec<Row>>,
    file: Mutex<File>,
    path: PathBuf,
    done: Mutex<bool>,
}

impl Sink {
    /// A sink appending to `path`, for the sub-checks `plan` (section, check).
    ///
    /// # Errors
    /// The file can't be opened.
    pub fn new(title: String, plan: Vec<(String, String)>, path: &Path) -> anyhow::Result<Self> {
        let mut file = File::options().create(true).append(true).open(path)?;
        writeln!(file, "# {title}")?;
        Ok(Self {
            title,
            plan,
            rows: Mutex::new(Vec::new()),
            file: Mutex::new(file),
            path: path.to_owned(),
            done: Mutex::new(false),
        })
    }

    /// Prints `row`, appends it to the file and keeps it for the table. The first row of a
    /// sub-check wins: the watchdog filling in what a deadline cut off and a section that is
    /// still winding down may both speak for it at once.
    pub fn emit(&self, row: Row) {
        let mut rows = self.rows.locked();
        if rows
            .iter()
            .any(|r| r.section == row.section && r.check == row.check)
        {
            return;
        }
        let line = format!(
            "{} | {} | {} | {} | {} | {}",
            row.verdict.as_str(),
            row.section,
            row.check,
            row.gpuwarden,
            row.reference,
            row.note
        );
        println!("gpu-check: {line}");
        if let Ok(mut f) = self.file.lock() {
            let _ = writeln!(f, "{line}");
            let _ = f.flush();
        }
        rows.push(row);
    }

    fn has(&self, section: &str, check: &str) -> bool {
        self.rows
            .locked()
            .iter()
            .any(|r| r.section == section && r.check == check)
    }

    /// A FAIL row, saying `why`, for each planned sub-check of `section` (every section when
    /// `None`) that has no row yet.
    pub fn fill_missing(&self, section: Option<&str>, why: &str) {
        for (s, c) in &self.plan {
            if section.is_none_or(|x| x == s) && !self.has(s, c) {
                self.emit(Row::new(s.clone(), c.clone(), "—", "", Verdict::Fail).note(why));
            }
        }
    }

    /// Every row so far.
    #[must_use]
    pub fn rows(&self) -> Vec<Row> {
        self.rows.locked().clone()
    }

    /// Prints the table once (and appends it to the file); later calls do nothing.
    pub fn finish(&self) -> String {
        let mut done = self.done.locked();
        let table = render(&self.title, &self.rows());
        if !*done {
            *done = true;
            print!("\n{table}");
            if let Ok(mut f) = self.file.lock() {
                let _ = write!(f, "\n{table}");
            }
            println!("gpu-check: rows and table in {}", self.path.display());
        }
        table
    }
}

/// What a section's body reports through: its rows, what it is doing, the logs to show.
pub struct Section {
    name: String,
    sink: Arc<Sink>,
    closed: Mutex<bool>,
    doing: Mutex<String>,
    logs: Mutex<Vec<PathBuf>>,
}

impl Section {
    /// The section's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Emits a row of this section (dropped once the section's deadline has passed: its row is
    /// already the deadline's FAIL).
    pub fn row(&self, row: Row) {
        if !*self.closed.locked() {
            self.sink.emit(row);
        }
    }

    /// Says what the section is doing now (a deadline's row names it).
    pub fn doing(&self, what: impl Into<String>) {
        *self.doing.locked() = what.into();
    }

    /// Adds a log whose tail is printed when the section has a FAIL.
    pub fn log(&self, path: PathBuf) {
        self.logs.locked().push(path);
    }

    fn now_doing(&self) -> String {
        self.doing.locked().clone()
    }
}

/// The last `n` lines of `path`.
#[must_use]
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs `body` as section `index` named `name` under `deadline`; every planned sub-check of it
/// has a row afterwards, whatever happened.
pub fn run_section<F>(
    sink: &Arc<Sink>,
    index: usize,
    name: &str,
    deadline: Duration,
    always_logs: &[PathBuf],
    body: F,
) where
    F: FnOnce(&Section) -> anyhow::Result<()> + Send + 'static,
{
    eprintln!(
        "gpu-check: section {name} (deadline {} s)…",
        deadline.as_secs()
    );
    let section = Arc::new(Section {
        name: name.to_owned(),
        sink: Arc::clone(sink),
        closed: Mutex::new(false),
        doing: Mutex::new("starting".into()),
        logs: Mutex::new(always_logs.to_vec()),
    });
    let (tx, rx) = mpsc::channel();
    let worker = Arc::clone(&section);
    let started = Instant::now();
    let spawned = std::thread::Builder::new()
        .name(format!("gpu-check {name}"))
        .spawn(move || {
            procs::enter_section(index);
            let result = body(&worker);
            let _ = tx.send(result);
        });
    let why = match spawned {
        Err(e) => Some(format!("not run: cannot start its thread: {e}")),
        Ok(_) => match rx.recv_timeout(deadline) {
            Ok(Ok(())) => Some("not measured (the section ended without it)".to_owned()),
            Ok(Err(e)) => Some(format!(
                "not reached: {e:#} (while {})",
                section.now_doing()
            )),
            Err(_) => {
                let doing = section.now_doing();
                *section.closed.locked() = true;
                procs::kill_section(index);
                // Its waits end once its processes are gone; a stuck thread is left behind.
                let _ = rx.recv_timeout(Duration::from_secs(10));
                Some(format!(
                    "deadline of {} s hit while {doing}; its processes were killed",
                    deadline.as_secs()
                ))
            }
        },
    };
    if let Some(why) = why {
        sink.fill_missing(Some(name), &why);
    }
    let failed = sink
        .rows()
        .iter()
        .any(|r| r.section == name && r.verdict == Verdict::Fail);
    if failed {
        let logs: BTreeSet<PathBuf> = section.logs.locked().iter().cloned().collect();
        for log in logs {
            eprintln!(
                "gpu-check: --- tail of {} ---\n{}",
                log.display(),
                tail(&log, 12)
            );
        }
    }
    eprintln!(
        "gpu-check: section {name} done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The whole run's deadline, armed by [`watchdog`].
pub struct Watchdog {
    /// Dropped to wake the watchdog's thread early.
    _cancel: mpsc::Sender<()>,
    /// Whether it fired (`Some(true)`) or was disarmed (`Some(false)`): decided once, under the
    /// lock, so the run ends one way only.
    state: Arc<Mutex<Option<bool>>>,
}

impl Watchdog {
    /// Disarms it as the run ends on its own. If it fired first, it is ending the process
    /// (the table, then status 3): this thread waits for that rather than exit another way.
    pub fn disarm(self) {
        let fired = {
            let mut state = self.state.locked();
            *state.get_or_insert(false)
        };
        if fired {
            loop {
                std::thread::park();
            }
        }
    }
}

/// Holds the whole run to `deadline`: when it passes, fills in every missing row, prints the
/// table, kills every child and exits with status 3, unless the run was disarmed first
/// ([`Watchdog::disarm`]).
pub fn watchdog(sink: Arc<Sink>, deadline: Duration) -> Watchdog {
    let (tx, rx) = mpsc::channel::<()>();
    let state = Arc::new(Mutex::new(None));
    let decided = Arc::clone(&state);
    std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(deadline)
            && *decided.locked().get_or_insert(true)
        {
            let why = format!(
                "not reached: the whole run's deadline of {} s passed",
                deadline.as_secs()
            );
            eprintln!("gpu-check: {why}; killing every child");
            // Rows first: a section that sees the run closing once its children are killed
            // would otherwise speak for its sub-checks with a vaguer reason (the first row wins).
            sink.fill_missing(None, &why);
            procs::kill_all();
            sink.finish();
            std::process::exit(3);
        }
    });
    Watchdog { _cancel: tx, state }
}
