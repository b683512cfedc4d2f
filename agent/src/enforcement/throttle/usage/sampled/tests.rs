use super::*;

const P: u64 = 166_667;
const T0: u64 = 1_750_000_000_000_000;

fn dev(ts: u64, util: u32) -> DeviceSample {
    DeviceSample {
        timestamp_us: ts,
        util_percent: util,
    }
}

fn proc(pid: u32, ts: u64, sm: u32) -> ProcessSample {
    ProcessSample {
        pid,
        timestamp_us: ts,
        sm_util_percent: sm,
    }
}

/// pid 1 in /cg/a, pid 2 in /cg/b, pid 3 in /cg/a/sub, pid 9 in no bound cgroup; others gone.
fn lookup(pid: u32) -> Option<PathBuf> {
    match pid {
        1 => Some("/cg/a".into()),
        2 => Some("/cg/b".into()),
        3 => Some("/cg/a/sub".into()),
        9 => Some("/system.slice/x".into()),
        _ => None,
    }
}

/// Queries at `ts` (the device sample arrives) and again [`GRACE_US`] later (it is charged).
fn settle(s: &mut SampledUsage, ts: u64) {
    s.settle(ts, &mut lookup);
    s.settle(ts + GRACE_US, &mut lookup);
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap()
}

/// Periods `1..=n` after an anchor at `T0`, each `util` % busy with `procs(k)` active.
fn feed(s: &mut SampledUsage, n: u64, util: u32, procs: impl Fn(u64) -> Vec<(u32, u32)>) {
    s.add_device(&[dev(T0, 0)]);
    for k in 1..=n {
        let ts = T0 + k * P;
        s.add_device(&[dev(ts, util)]);
        let ps: Vec<_> = procs(k)
            .into_iter()
            .map(|(pid, sm)| proc(pid, ts, sm))
            .collect();
        s.add_processes(&ps);
        settle(s, ts);
    }
}

#[test]
fn one_process_alone_is_charged_the_gpus_busy_time() {
    let mut s = SampledUsage::new();
    // sm_util says 40 but the GPU was 60 % busy: the device figure is what is charged.
    feed(&mut s, 6, 60, |_| vec![(1, 40)]);
    assert_eq!(us(s.busy(Path::new("/cg/a"))), 6 * P * 60 / 100);
    assert_eq!(s.until_us(), Some(T0 + 6 * P));
    assert_eq!(s.stats().unattributed, Duration::ZERO);
}

#[test]
fn two_processes_split_by_their_activity_and_parents_sum_children() {
    let mut s = SampledUsage::new();
    feed(&mut s, 3, 90, |_| vec![(1, 30), (2, 60), (3, 0)]);
    let a = us(s.busy(Path::new("/cg/a")));
    let b = us(s.busy(Path::new("/cg/b")));
    assert!(a.abs_diff(3 * P * 90 / 100 / 3) <= 1, "{a}");
    assert!(b.abs_diff(3 * P * 90 / 100 * 2 / 3) <= 1, "{b}");
    assert_eq!(
        s.busy(Path::new("/cg")),
        s.busy(Path::new("/cg/a")) + s.busy(Path::new("/cg/b"))
    );
}

#[test]
fn a_process_without_samples_in_a_gap_is_charged_nothing_for_it() {
    let mut s = SampledUsage::new();
    // Active in periods 1 and 6 only (frozen between): charged for two periods, not six.
    feed(&mut s, 6, 50, |k| {
        if k == 1 || k == 6 {
            vec![(1, 50)]
        } else {
            vec![]
        }
    });
    assert_eq!(us(s.busy(Path::new("/cg/a"))), 2 * P / 2);
    // The device said busy in periods 2..5 with no process to charge: unattributed, not lost
    // from view.
    assert_eq!(us(s.stats().unattributed), 4 * P / 2);
}

#[test]
fn processes_in_no_bound_cgroup_or_gone_take_their_part_from_nobody() {
    let mut s = SampledUsage::new();
    feed(&mut s, 2, 100, |_| vec![(1, 25), (9, 25), (77, 50)]);
    assert_eq!(us(s.busy(Path::new("/cg/a"))), 2 * P / 4);
    assert_eq!(s.busy(Path::new("/cg/b")), Duration::ZERO);
    // pid 9's part goes to its own (unbound) cgroup, pid 77's (gone) to nobody.
    assert_eq!(us(s.busy(Path::new("/system.slice"))), 2 * P / 4);
    assert_eq!(us(s.stats().unattributed), 2 * P / 2);
}

#[test]
fn no_new_samples_still_advance_until_within_the_lag_bound() {
    let mut s = SampledUsage::new();
    feed(&mut s, 1, 100, |_| vec![(1, 100)]);
    let busy = s.busy(Path::new("/cg/a"));
    // The driver reports nothing new (NotFound) for three seconds.
    let later = T0 + P + 3_000_000;
    s.settle(later, &mut lookup);
    assert_eq!(s.until_us(), Some(later - MAX_LAG_US));
    assert_eq!(s.busy(Path::new("/cg/a")), busy);
    // A device sample that then arrives for the skipped span covers only what is after until
    // (and at most MAX_INTERVAL_US: too few gaps were seen to know the sample period).
    s.add_device(&[dev(later, 100)]);
    s.add_processes(&[proc(1, later, 100)]);
    settle(&mut s, later);
    assert_eq!(
        us(s.busy(Path::new("/cg/a")).saturating_sub(busy)),
        MAX_INTERVAL_US
    );
}

#[test]
fn before_any_sample_until_starts_at_the_first_query() {
    let mut s = SampledUsage::new();
    s.settle(T0, &mut lookup);
    assert_eq!(s.until_us(), Some(T0));
    s.settle(T0 + 2 * MAX_LAG_US, &mut lookup);
    assert_eq!(s.until_us(), Some(T0 + MAX_LAG_US));
}

#[test]
fn stale_and_backwards_timestamps_are_ignored() {
    let mut s = SampledUsage::new();
    feed(&mut s, 3, 100, |_| vec![(1, 100)]);
    let busy = s.busy(Path::new("/cg/a"));
    // The same samples read again, and samples older than the newest (a clock gone back).
    s.add_device(&[dev(T0 + 3 * P, 100), dev(T0 + P, 100)]);
    s.add_processes(&[proc(1, T0 + 2 * P, 100)]);
    s.settle(T0 + 4 * P, &mut lookup);
    assert_eq!(s.busy(Path::new("/cg/a")), busy);
    assert_eq!(s.stats().stale_device_samples, 2);
    assert_eq!(s.stats().late_samples, 1);
    assert_eq!(s.until_us(), Some(T0 + 3 * P));
}

#[test]
fn a_process_sample_read_twice_counts_once_and_one_published_late_still_counts() {
    let mut s = SampledUsage::new();
    s.add_device(&[dev(T0, 0), dev(T0 + P, 100)]);
    s.add_processes(&[proc(1, T0 + P, 50)]);
    s.settle(T0 + P, &mut lookup);
    // Next query: the same sample again, and one for pid 2 published late.
    s.add_processes(&[proc(1, T0 + P, 50), proc(2, T0 + P + 1_000, 50)]);
    s.settle(T0 + P + GRACE_US, &mut lookup);
    assert_eq!(s.until_us(), Some(T0 + P));
    assert_eq!(us(s.busy(Path::new("/cg/a"))), P / 2);
    assert_eq!(us(s.busy(Path::new("/cg/b"))), P / 2);
}

#[test]
fn process_samples_before_their_device_sample_wait_for_it() {
    let mut s = SampledUsage::new();
    s.add_device(&[dev(T0, 0)]);
    s.add_processes(&[proc(1, T0 + P, 100)]);
    s.settle(T0 + P, &mut lookup);
    assert_eq!(s.busy(Path::new("/cg/a")), Duration::ZERO);
    s.add_device(&[dev(T0 + P, 80)]);
    settle(&mut s, T0 + P);
    assert_eq!(us(s.busy(Path::new("/cg/a"))), P * 80 / 100);
}

#[test]
fn a_gap_of_lost_samples_is_charged_one_period_at_most_twice() {
    let mut s = SampledUsage::new();
    feed(&mut s, 5, 100, |_| vec![(1, 100)]);
    let busy = s.busy(Path::new("/cg/a"));
    // Ten periods later, one sample: it covers twice the usual period, not ten.
    let ts = T0 + 15 * P;
    s.add_device(&[dev(ts, 100)]);
    s.add_processes(&[proc(1, ts, 100)]);
    settle(&mut s, ts);
    let added = us(s.busy(Path::new("/cg/a")).saturating_sub(busy));
    assert!(added.abs_diff(2 * P) <= 2, "{added}");
}

#[test]
fn cgroups_that_are_gone_fold_into_their_parents_and_figures_stay() {
    let mut s = SampledUsage::new();
    // /cg/a, /cg/a/sub and /cg/b each run alone for two periods.
    feed(&mut s, 6, 90, |k| {
        vec![(u32::try_from((k - 1) / 2 + 1).unwrap(), 50)]
    });
    let before: Vec<Duration> = ["/cg", "/cg/a", "/cg/a/sub", "/cg/b"]
        .iter()
        .map(|d| s.busy(Path::new(d)))
        .collect();
    assert!(before.iter().all(|d| !d.is_zero()), "{before:?}");
    assert_eq!(s.cgroups(), 3);
    // /cg/a/sub and /cg/b are gone; /cg/a stays.
    s.prune(&mut |dir| dir == Path::new("/cg/a"));
    assert_eq!(
        s.busy(Path::new("/cg")),
        before[0],
        "/cg keeps everything under it"
    );
    assert_eq!(
        s.busy(Path::new("/cg/a")),
        before[1],
        "/cg/a keeps /cg/a/sub's"
    );
    assert_eq!(s.busy(Path::new("/cg/a/sub")), Duration::ZERO);
    assert_eq!(s.busy(Path::new("/cg/b")), Duration::ZERO);
    // /cg/a, and /cg holding what /cg/b used.
    assert_eq!(s.cgroups(), 2);
}
