//! Fuzz target: the convex projection every fitted and combined latency curve goes through
//! (`ilb_planning::profile::project_convex_increasing_weighted`), on arbitrary points: any f64
//! bit patterns as loads, latencies and weights, ties, NaN and infinities.
//!
//! Checks that it returns one knot per distinct usable load, sorted, with finite latencies that
//! are non-decreasing and convex (relative to the data's scale), and that projecting the result
//! again moves nothing beyond that scale.

#![no_main]

use ilb_planning::profile::project_convex_increasing_weighted;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let points: Vec<(f64, f64, f64)> = data
        .chunks_exact(24)
        .take(200)
        .map(|c| {
            let f = |i: usize| f64::from_le_bytes(c[i..i + 8].try_into().unwrap());
            (f(0), f(8), f(16))
        })
        .collect();
    let usable: Vec<&(f64, f64, f64)> =
        points.iter().filter(|(x, y, w)| x.is_finite() && y.is_finite() && w.is_finite() && *w > 0.0).collect();
    let projected = project_convex_increasing_weighted(&points);
    let mut loads: Vec<f64> = usable.iter().map(|p| p.0).collect();
    loads.sort_by(f64::total_cmp);
    loads.dedup();
    assert_eq!(projected.len(), loads.len());
    assert!(projected.iter().zip(&loads).all(|(p, x)| p.0 == *x));
    // Only well-scaled data have a meaningful tolerance: latencies within 1e9, loads within
    // 1e6 and no two closer than a millionth of their range (the stopping rule is relative to
    // the range: two knots 3e-5 apart on a range of 1e5 are one hinge to it, and the result is
    // optimal within its tolerance but not the same curve twice).
    let scale = usable.iter().map(|p| p.1.abs()).fold(1.0, f64::max);
    let range = loads.last().zip(loads.first()).map_or(0.0, |(last, first)| last - first);
    let spans_ok =
        loads.windows(2).all(|w| w[1] - w[0] > 1e-6 * range.max(1.0)) && loads.iter().all(|x| x.abs() < 1e6);
    let weights_ok = usable.iter().all(|p| (1e-6..1e6).contains(&p.2));
    if scale > 1e9 || !spans_ok || !weights_ok {
        return;
    }
    assert!(projected.iter().all(|p| p.1.is_finite()), "{projected:?}");
    let slopes: Vec<f64> = projected.windows(2).map(|w| (w[1].1 - w[0].1) / (w[1].0 - w[0].0)).collect();
    let tolerance = 1e-6 * scale;
    for (i, s) in slopes.iter().enumerate() {
        let before = if i == 0 { 0.0 } else { slopes[i - 1] };
        assert!(*s >= before - tolerance, "slope {s} after {before} at {i}: {points:?} -> {projected:?}");
    }
    let again: Vec<(f64, f64, f64)> = projected.iter().map(|&(x, y)| (x, y, 1.0)).collect();
    for (a, b) in projected.iter().zip(project_convex_increasing_weighted(&again)) {
        assert!((a.1 - b.1).abs() <= 1e-6 * scale, "{projected:?}");
    }
});
