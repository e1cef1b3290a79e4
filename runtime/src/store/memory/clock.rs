//! The clocks a memory store (and a SQLite store, or a cache) judges time by.

use super::*;

/// A source of the current time, injectable so lease and retention tests need no sleeping.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to.
///
/// ```
/// use std::time::Duration;
/// use toolkey::store::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let t0 = clock.now();
/// clock.advance(Duration::from_secs(31));
/// assert_eq!(clock.now().duration_since(t0).unwrap(), Duration::from_secs(31));
/// ```
#[derive(Debug)]
pub struct ManualClock {
    now_ms: Mutex<i64>,
}

impl ManualClock {
    /// A clock standing at the current system time.
    pub fn new() -> Self {
        ManualClock {
            now_ms: Mutex::new(to_millis(SystemTime::now())),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        *self.now_ms.lock().expect("clock lock") += millis(by);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        from_millis(*self.now_ms.lock().expect("clock lock"))
    }
}

impl<C: Clock> Clock for Arc<C> {
    fn now(&self) -> SystemTime {
        (**self).now()
    }
}
