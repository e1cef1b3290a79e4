//! Two sides of a ratio timed side by side, in rounds, for the benches that print their ratios.

/// True on a whole run of a bench (`cargo bench --bench <name>`: no filter, no other mode), or
/// with `TOOLKEY_BENCH_RATIOS` set: the side-by-side rounds take a few seconds more.
pub fn whole_run() -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    args == ["--bench"] || std::env::var_os("TOOLKEY_BENCH_RATIOS").is_some()
}

/// Runs `run` `runs` times; the time they took.
pub fn timed(runs: usize, run: &dyn Fn()) -> std::time::Duration {
    let start = std::time::Instant::now();
    for _ in 0..runs {
        run();
    }
    start.elapsed()
}

/// Times `a` and `b` side by side, each making `runs` runs in turn in every round, the side that
/// goes first alternating, so that drift over the run (a disk whose flushes vary from minute to
/// minute) touches both alike. Prints each side's median time per run over the rounds, and the
/// median over the rounds of the ratio a / b.
pub fn side_by_side(
    what: &str,
    runs: usize,
    mut a: impl FnMut(usize) -> std::time::Duration,
    mut b: impl FnMut(usize) -> std::time::Duration,
) {
    const ROUNDS: usize = 21;
    let (mut per_a, mut per_b, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    // One round more than counted: the first warms both sides up.
    for round in 0..=ROUNDS {
        let (ta, tb) = if round % 2 == 0 {
            let ta = a(runs);
            (ta, b(runs))
        } else {
            let tb = b(runs);
            (a(runs), tb)
        };
        if round > 0 {
            let (ta, tb) = (
                ta.as_secs_f64() / runs as f64,
                tb.as_secs_f64() / runs as f64,
            );
            per_a.push(ta);
            per_b.push(tb);
            ratios.push(ta / tb);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // Seconds as nanoseconds below ten microseconds, as microseconds above.
    let shown = |s: f64| {
        if s < 1e-5 {
            format!("{:.0} ns", s * 1e9)
        } else {
            format!("{:.2} µs", s * 1e6)
        }
    };
    println!(
        "{what}: {ROUNDS} rounds of {runs} runs of each in turn: {} against {} per run (medians), \
         {:.2}x (the median of the rounds' ratios)",
        shown(median(per_a)),
        shown(median(per_b)),
        median(ratios)
    );
}
