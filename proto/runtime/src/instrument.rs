//! Metrics declared once. Each instrument's name, unit, attributes and meaning live in one
//! [`Instrument`] constant; the instrument is built from it (its description is the meaning) by
//! a [`Registry`], which remembers what it built, and docs/metrics.md's row is checked against
//! it ([`Instrument::row`], [`undocumented`]). A test of each daemon then holds its table, what
//! it registers and the docs together.

use opentelemetry::metrics::{
    AsyncInstrumentBuilder, Histogram, HistogramBuilder, Meter, ObservableCounter, ObservableGauge,
};

/// One instrument, as docs/metrics.md lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instrument {
    /// Its name (`hw.gpu.memory.usage`, `gpuwarden.…`).
    pub name: &'static str,
    /// Its unit (UCUM, or `{thing}` for a count).
    pub unit: &'static str,
    /// The attributes it carries, as the docs name them (empty: none).
    pub attributes: &'static str,
    /// What it measures: the docs' text and the instrument's description.
    pub meaning: &'static str,
}

impl Instrument {
    /// The row docs/metrics.md shows for it.
    #[must_use]
    pub fn row(&self) -> String {
        let attributes = if self.attributes.is_empty() {
            "—"
        } else {
            self.attributes
        };
        format!(
            "| `{}` | {} | {attributes} | {} |",
            self.name, self.unit, self.meaning
        )
    }
}

/// Builds instruments on a meter from their [`Instrument`] constants, and remembers which.
pub struct Registry<'m> {
    meter: &'m Meter,
    registered: Vec<&'static str>,
}

impl<'m> Registry<'m> {
    /// Builds on `meter`.
    #[must_use]
    pub fn new(meter: &'m Meter) -> Self {
        Self {
            meter,
            registered: Vec::new(),
        }
    }

    /// The names built so far, in order.
    #[must_use]
    pub fn registered(&self) -> &[&'static str] {
        &self.registered
    }

    /// An observable `u64` gauge.
    pub fn u64_gauge(
        &mut self,
        i: &Instrument,
    ) -> AsyncInstrumentBuilder<'m, ObservableGauge<u64>, u64> {
        self.registered.push(i.name);
        self.meter
            .u64_observable_gauge(i.name)
            .with_unit(i.unit)
            .with_description(i.meaning)
    }

    /// An observable `f64` gauge.
    pub fn f64_gauge(
        &mut self,
        i: &Instrument,
    ) -> AsyncInstrumentBuilder<'m, ObservableGauge<f64>, f64> {
        self.registered.push(i.name);
        self.meter
            .f64_observable_gauge(i.name)
            .with_unit(i.unit)
            .with_description(i.meaning)
    }

    /// An observable `u64` counter.
    pub fn u64_counter(
        &mut self,
        i: &Instrument,
    ) -> AsyncInstrumentBuilder<'m, ObservableCounter<u64>, u64> {
        self.registered.push(i.name);
        self.meter
            .u64_observable_counter(i.name)
            .with_unit(i.unit)
            .with_description(i.meaning)
    }

    /// An observable `f64` counter.
    pub fn f64_counter(
        &mut self,
        i: &Instrument,
    ) -> AsyncInstrumentBuilder<'m, ObservableCounter<f64>, f64> {
        self.registered.push(i.name);
        self.meter
            .f64_observable_counter(i.name)
            .with_unit(i.unit)
            .with_description(i.meaning)
    }

    /// An `f64` histogram.
    pub fn f64_histogram(&mut self, i: &Instrument) -> HistogramBuilder<'m, Histogram<f64>> {
        self.registered.push(i.name);
        self.meter
            .f64_histogram(i.name)
            .with_unit(i.unit)
            .with_description(i.meaning)
    }
}

/// What differs between the instruments `registered` and those `declared`: names registered
/// twice, registered undeclared, or declared unregistered. Empty when each declared one was
/// registered once.
#[must_use]
pub fn unregistered(registered: &[&str], declared: &[Instrument]) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, name) in registered.iter().enumerate() {
        if registered[..i].contains(name) {
            problems.push(format!("{name} is registered twice"));
        }
        if !declared.iter().any(|d| d.name == *name) {
            problems.push(format!("{name} is registered but not declared"));
        }
    }
    for d in declared {
        if !registered.contains(&d.name) {
            problems.push(format!("{} is declared but not registered", d.name));
        }
    }
    problems
}

/// What is wrong between `instruments` and the table of `docs` that starts at the heading
/// `section` and ends before the first line starting with `end`: rows missing from the docs,
/// and how many rows the docs list beyond them. Empty when they agree.
#[must_use]
pub fn undocumented(
    docs: &str,
    section: &str,
    end: &str,
    instruments: &[Instrument],
) -> Vec<String> {
    let mut problems: Vec<String> = instruments
        .iter()
        .map(Instrument::row)
        .filter(|row| !docs.contains(row.as_str()))
        .map(|row| format!("docs/metrics.md lacks the row\n{row}"))
        .collect();
    let table = docs
        .split(section)
        .nth(1)
        .and_then(|rest| rest.split(end).next())
        .unwrap_or_default();
    let rows = table.lines().filter(|l| l.starts_with("| `")).count();
    if rows != instruments.len() {
        problems.push(format!(
            "{section} in docs/metrics.md lists {rows} metrics, the code {}",
            instruments.len()
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Instrument = Instrument {
        name: "a.b",
        unit: "By",
        attributes: "",
        meaning: "what a is",
    };

    #[test]
    fn a_row_is_the_docs_table_row() {
        assert_eq!(A.row(), "| `a.b` | By | — | what a is |");
    }

    #[test]
    fn the_docs_check_finds_a_missing_row_and_an_extra_one() {
        let docs = "## M\n| `a.b` | By | — | what a is |\n## N\n";
        assert!(undocumented(docs, "## M", "## ", &[A]).is_empty());
        let extra = "## M\n| `a.b` | By | — | what a is |\n| `c` | 1 | — | c |\n## N\n";
        assert_eq!(undocumented(extra, "## M", "## ", &[A]).len(), 1);
        assert_eq!(undocumented("## M\n## N\n", "## M", "## ", &[A]).len(), 2);
    }

    #[test]
    fn registrations_are_held_to_the_declarations() {
        assert!(unregistered(&["a.b"], &[A]).is_empty());
        assert_eq!(unregistered(&["a.b", "a.b"], &[A]).len(), 1);
        assert_eq!(unregistered(&["c"], &[A]).len(), 2);
    }

    #[test]
    fn the_registry_remembers_what_it_built() {
        let meter = opentelemetry::global::meter("test");
        let mut registry = Registry::new(&meter);
        registry.u64_gauge(&A).with_callback(|_| {}).build();
        assert_eq!(registry.registered(), ["a.b"]);
    }
}
