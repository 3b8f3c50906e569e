//! The only place that reads the wall clock: a stopwatch for the benchmark example.

/// Wall-clock stopwatch.
pub struct Stopwatch(std::time::Instant);

impl Stopwatch {
    #[allow(clippy::disallowed_methods)]
    pub fn start() -> Stopwatch {
        Stopwatch(std::time::Instant::now())
    }

    #[allow(clippy::disallowed_methods)]
    pub fn elapsed_s(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}
