use std::io::Cursor;

use super::{
    cluster::{Behaviour, Demand, contend},
    rng::Rng,
    trace::{self, GenConfig, TraceError},
    *,
};

fn small() -> (Vec<trace::Job>, SimConfig) {
    let config = SimConfig {
        cluster: cluster::ClusterShape {
            nodes: 2,
            gpus_per_node: 8,
        },
        ..SimConfig::default()
    };
    let jobs = trace::generate(
        &GenConfig {
            jobs: 60,
            gpus: config.cluster.gpus(),
            median_work: 600.0,
            ..GenConfig::default()
        },
        3,
    );
    (jobs, config)
}

#[test]
fn same_seed_same_report_other_seed_other_trace() {
    let (jobs, config) = small();
    let a = evaluate(&jobs, &config, 3).unwrap();
    let b = evaluate(&jobs, &config, 3).unwrap();
    assert_eq!(a, b);
    let gen_config = GenConfig::default();
    assert_eq!(
        trace::generate(&gen_config, 1),
        trace::generate(&gen_config, 1)
    );
    assert_ne!(
        trace::generate(&gen_config, 1),
        trace::generate(&gen_config, 2)
    );
}

#[test]
fn every_mode_completes_every_job() {
    let (jobs, config) = small();
    let report = evaluate(&jobs, &config, 3).unwrap();
    let measured = jobs.len() - report.warmup_jobs;
    for m in &report.modes {
        assert_eq!(m.rejected, 0, "{m:?}");
        assert_eq!(m.completed, measured, "{m:?}");
        assert!(m.mean_jct > 0.0 && m.p95_jct >= m.mean_jct * 0.5, "{m:?}");
        assert!((0.0..=1.0).contains(&m.mean_utilization), "{m:?}");
    }
    assert!(report.table().contains("interference-aware"));
    // No mode beats its jobs' work alone: the bound holds for every mode's mean JCT.
    for m in &report.modes {
        assert!(m.mean_jct >= m.mean_work * (1.0 - 1e-9), "{m:?}");
    }
    let bound = report.bound().unwrap();
    let base = report.mode(Placement::Binpack).unwrap();
    assert!((bound - (1.0 - base.mean_work / base.mean_jct)).abs() < 1e-12);
    let table = report.table();
    assert!(
        table.contains("floors:") && table.contains("bound:"),
        "{table}"
    );
    let sweep = super::report::sweep_table("load", &[(0.5, report.clone()), (0.9, report)]);
    assert_eq!(sweep.lines().count(), 4, "{sweep}");
    assert!(
        sweep.lines().nth(2).unwrap().starts_with("| 0.5 |"),
        "{sweep}"
    );
}

#[test]
fn trace_round_trips_and_errors_name_the_line() {
    let jobs = trace::generate(
        &GenConfig {
            jobs: 5,
            ..GenConfig::default()
        },
        9,
    );
    let text = trace::to_jsonl(&jobs);
    assert_eq!(trace::parse(Cursor::new(text.as_bytes())).unwrap(), jobs);

    let good = r#"{"id":"a","arrival":0,"slots":["cuda.shares=0.5"],"class":"c","work":10}"#;
    let cases = [
        (format!("{good}\n\nnot json\n"), 3),
        (
            format!(
                "{good}\n{}",
                good.replace("\"a\"", "\"b\"").replace("10}", "-1}")
            ),
            2,
        ),
        (
            format!(
                "{good}\n{}",
                good.replace("\"a\"", "\"b\"").replace("0.5", "lots")
            ),
            2,
        ),
        (format!("{good}\n{good}"), 2),
        (good.replace("\"work\"", "\"wrok\""), 1),
    ];
    for (text, line) in cases {
        let err = trace::parse(Cursor::new(text.as_bytes())).unwrap_err();
        let named = matches!(&err, TraceError::Json { line: l, .. } | TraceError::Invalid { line: l, .. } if *l == line);
        assert!(named, "{text:?}: {err}");
        assert!(err.to_string().contains(&format!("line {line}")), "{err}");
    }
    assert!(matches!(
        trace::parse(Cursor::new(&b"\n"[..])),
        Err(TraceError::Empty)
    ));
}

#[test]
fn the_bundled_trace_is_the_generator_at_seed_one() {
    let bundled = include_str!("../trace.jsonl");
    let parsed = trace::parse(Cursor::new(bundled.as_bytes())).unwrap();
    assert_eq!(parsed, trace::generate(&GenConfig::default(), 1));
}

#[test]
fn alone_no_slowdown_and_oversubscription_slows() {
    for u in [0.0, 0.3, 1.0] {
        let s = contend(&[(u, 0.9)]);
        assert!((s[0].rate - 1.0).abs() < 1e-12, "{s:?}");
        assert!((s[0].delivered - u).abs() < 1e-12, "{s:?}");
    }
    // 0.8 + 0.6 = 1.4: each gets 1/1.4 of its demand, and contention on top.
    let s = contend(&[(0.8, 0.5), (0.6, 0.5)]);
    assert!(s.iter().all(|x| x.rate < 1.0 / 1.4 + 1e-12), "{s:?}");
    let delivered: f64 = s.iter().map(|x| x.delivered).sum();
    assert!((delivered - 1.0).abs() < 1e-12, "{s:?}");
    // Under one device, only the hidden contention slows, and more for memory-bound pairs.
    let light = contend(&[(0.4, 0.2), (0.4, 0.2)]);
    let heavy = contend(&[(0.4, 0.9), (0.4, 0.9)]);
    assert!(
        light[0].rate < 1.0 && heavy[0].rate < light[0].rate,
        "{light:?} {heavy:?}"
    );
    // An idle tenant neither suffers nor inflicts anything.
    let s = contend(&[(0.0, 0.9), (0.7, 0.9)]);
    assert!(
        (s[0].rate - 1.0).abs() < 1e-12 && (s[1].rate - 1.0).abs() < 1e-12,
        "{s:?}"
    );
}

#[test]
fn demand_follows_its_class() {
    for (class, expected) in [
        ("train-0", Behaviour::of("train")),
        ("notebook-3", Behaviour::of("notebook")),
    ] {
        let mut d = Demand::new(class, Rng::new(5));
        let n = 20_000;
        let mean = (0..n).map(|_| d.draw()).sum::<f64>() / f64::from(n);
        assert!(
            (mean - expected.mean()).abs() < 0.06,
            "{class}: {mean} vs {}",
            expected.mean()
        );
    }
    assert_eq!(Behaviour::of("no-such-family"), cluster::DEFAULT_BEHAVIOUR);
}

#[test]
fn a_trace_with_mig_requests_asks_for_one_instance_of_the_balanced_profiles() {
    let jobs = trace::generate(
        &GenConfig {
            mig: 0.3,
            ..GenConfig::default()
        },
        1,
    );
    let mig: Vec<&trace::Job> = jobs.iter().filter(|j| j.asks_mig()).collect();
    let share = mig.len() as f64 / jobs.len() as f64;
    assert!((0.26..0.34).contains(&share), "{share}");
    for j in &mig {
        assert_eq!(j.slots.len(), 1, "{j:?}");
        assert!(
            [
                "cuda.mig.1g.18gb=1",
                "cuda.mig.2g.35gb=1",
                "cuda.mig.3g.71gb=1"
            ]
            .contains(&j.slots[0].as_str()),
            "{j:?}"
        );
        assert!(j.requested().is_ok(), "{j:?}");
    }
    let small = mig
        .iter()
        .filter(|j| j.slots[0].contains("1g.18gb"))
        .count();
    assert!(
        small * 3 > mig.len() && small * 3 < mig.len() * 2,
        "{small} of {}",
        mig.len()
    );
    // Without MIG requests nothing more is drawn: the trace is the bundled one's generator's.
    assert_ne!(jobs, trace::generate(&GenConfig::default(), 1));
}
