//! How long a race test runs. A race against a sandbox that swaps links
//! proves something only after enough tries; a fixed time gives an idle
//! machine plenty and a loaded one (CI, a build beside) too few, and a
//! count alone could run for ever. So a race runs at least `least`, then
//! until it has made its tries, and never past `most`; only then is the
//! count judged.

use std::time::{Duration, Instant};

/// The bounds of one race, started when made.
#[derive(Debug, Clone, Copy)]
pub struct Race {
    tries: usize,
    least: Duration,
    most: Duration,
    started: Instant,
}

impl Race {
    /// A race that wants `tries` tries, runs at least `least` (what an idle
    /// machine needs) and at most `most`.
    pub fn start(tries: usize, least: Duration, most: Duration) -> Race {
        assert!(least <= most, "a race's least time is past its most");
        Race {
            tries,
            least,
            most,
            started: Instant::now(),
        }
    }

    /// Whether to stop after `tries` tries.
    pub fn done(&self, tries: usize) -> bool {
        let past = self.started.elapsed();
        past > self.most || (past > self.least && tries >= self.tries)
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Fails the test unless `tries` (of `what`: "calls", "writes") made
    /// a race worth its name.
    #[track_caller]
    pub fn assert_convincing(&self, tries: usize, what: &str) {
        assert!(
            tries >= self.tries,
            "only {tries} {what} in {:?}: not a convincing race",
            self.elapsed()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_race_runs_its_least_time_then_until_its_tries_or_its_most() {
        let r = Race::start(10, Duration::from_millis(50), Duration::from_millis(200));
        assert!(!r.done(100), "stopped before its least time");
        std::thread::sleep(Duration::from_millis(60));
        assert!(!r.done(9), "stopped short of its tries");
        assert!(r.done(10));
        std::thread::sleep(Duration::from_millis(150));
        assert!(r.done(0), "ran past its most");
        r.assert_convincing(10, "calls");
        let short = std::panic::catch_unwind(|| r.assert_convincing(9, "calls"));
        assert!(short.is_err());
    }
}
