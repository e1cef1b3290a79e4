//! How a tool runs: its settings, and its retry limit.

use std::fmt;
use std::num::NonZeroUsize;
use std::time::Duration;

/// How a keyed tool runs: defaults from DESIGN (lease 30 s, retention 7 days, no timeout).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    /// How long the caller waits before TIMEOUT (the body goes on). `None`: until it ends.
    pub timeout: Option<Duration>,
    /// How long a reservation holds without renewal; renewed while the body runs.
    pub lease: Duration,
    /// How long a completed outcome is replayed.
    pub retain: Duration,
    /// With `on_in_progress = "wait(..)"`: how long a duplicate waits for the first call.
    pub wait_in_progress: Option<Duration>,
    /// How many retryable failures of one call the tool accepts within a window before the call
    /// is answered `RETRY_LIMIT` (`retry_limit = "5/10m"`). [`RetryLimit::toolbox`] until the
    /// toolbox is built, which puts its own limit there.
    pub retry_limit: RetryLimit,
    /// At most this many of the tool's bodies run at once in this process (`concurrency = 2`);
    /// a call beyond it waits for a slot within its timeout, then is answered `BUSY`. `None`:
    /// no limit.
    pub concurrency: Option<NonZeroUsize>,
    /// Every call waits for a person's approval before it runs (`approval`), recorded in the
    /// store (see [`ToolboxBuilder::require_approval`](crate::ToolboxBuilder::require_approval)
    /// for a rule over the arguments instead).
    pub approval: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            timeout: None,
            lease: Duration::from_secs(30),
            retain: Duration::from_secs(7 * 24 * 60 * 60),
            wait_in_progress: None,
            retry_limit: RetryLimit::toolbox(),
            concurrency: None,
            approval: false,
        }
    }
}

/// The retry limit of a tool in a toolbox that sets none: 10 failures of one call within 10
/// minutes. Far past the two or three retries a model makes when a failure is passing, and well
/// before a loop costs much.
pub(crate) const DEFAULT_RETRY_LIMIT: RetryLimit = RetryLimit::after(10, Duration::from_secs(600));

/// How many retryable failures of one call a tool accepts within a window.
///
/// One call is one key for an `idempotent` tool; for a key on `<ctx.step>`, new at every call,
/// it is the key at a fixed step, the run and the arguments' fingerprint, what the model's retry
/// repeats. For every other story it is one tool with one set of arguments in one tenant, as the
/// tool receives them (read into its types, defaults applied, `#[arg(ignore)]` fields left out),
/// not as the JSON spells them. A failure is an answer that
/// invites a retry after the tool's code ran: a retryable error of the body or the recover hook,
/// a retryable `TIMEOUT` of a tool without a key (a keyed call's body goes on, and its retry finds
/// it in progress), an unknown outcome a recover hook will look up. When the count reaches
/// the limit, that answer and every later one for the same call within the window is
/// `RETRY_LIMIT` (not retryable), and the body does not run; when the key's record is unknown,
/// the answer says the action may have happened, and when a `ctx.once` step of the call had
/// finished, it says that part of the action was done and is kept. The window starts at the first failure; when it
/// ends the count starts again from zero. A success clears the count.
///
/// `"5/10m"`: five failures within ten minutes. `"off"`: no limit.
///
/// ```
/// use std::time::Duration;
/// use toolkey::RetryLimit;
///
/// let limit: RetryLimit = "5/10m".parse().unwrap();
/// assert_eq!(limit, RetryLimit::after(5, Duration::from_secs(600)));
/// assert_eq!((limit.failures(), limit.window()), (Some(5), Some(Duration::from_secs(600))));
/// assert_eq!("off".parse::<RetryLimit>().unwrap(), RetryLimit::off());
/// assert!("0/10m".parse::<RetryLimit>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RetryLimit(LimitKind);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
enum LimitKind {
    #[default]
    Toolbox,
    Off,
    After {
        failures: u32,
        window: Duration,
    },
}

impl RetryLimit {
    /// The toolbox's limit: what a tool that states none gets (see
    /// [`ToolboxBuilder::default_retry_limit`](crate::ToolboxBuilder::default_retry_limit)).
    pub const fn toolbox() -> RetryLimit {
        RetryLimit(LimitKind::Toolbox)
    }

    /// No limit: the same failing call may run again and again.
    pub const fn off() -> RetryLimit {
        RetryLimit(LimitKind::Off)
    }

    /// `failures` retryable failures of one call within `window`; the next answer is
    /// `RETRY_LIMIT`.
    ///
    /// # Panics
    ///
    /// When `failures` is 0 or `window` is zero: such a limit would refuse every call.
    pub const fn after(failures: u32, window: Duration) -> RetryLimit {
        assert!(
            failures > 0 && !window.is_zero(),
            "a retry limit allows at least one failure within a window longer than zero"
        );
        RetryLimit(LimitKind::After { failures, window })
    }

    /// How many failures the limit allows, unless it is off or the toolbox's.
    pub const fn failures(&self) -> Option<u32> {
        match self.0 {
            LimitKind::After { failures, .. } => Some(failures),
            _ => None,
        }
    }

    /// The window the failures are counted in, unless the limit is off or the toolbox's.
    pub const fn window(&self) -> Option<Duration> {
        match self.0 {
            LimitKind::After { window, .. } => Some(window),
            _ => None,
        }
    }

    /// True for [`RetryLimit::off`].
    pub const fn is_off(&self) -> bool {
        matches!(self.0, LimitKind::Off)
    }

    /// True for [`RetryLimit::toolbox`].
    pub const fn is_toolbox(&self) -> bool {
        matches!(self.0, LimitKind::Toolbox)
    }

    /// This limit, or `fallback` where this one is the toolbox's.
    pub(crate) fn or(self, fallback: RetryLimit) -> RetryLimit {
        if self.is_toolbox() {
            fallback
        } else {
            self
        }
    }
}

impl std::str::FromStr for RetryLimit {
    type Err = String;

    /// `"<failures>/<window>"` (`"5/10m"`, `"3/30s"`) or `"off"`.
    fn from_str(text: &str) -> Result<RetryLimit, String> {
        if text == "off" {
            return Ok(RetryLimit::off());
        }
        let expected = "expected failures and a window, as in `\"5/10m\"`, or `\"off\"`";
        let Some((failures, window)) = text.split_once('/') else {
            return Err(format!("invalid retry limit `{text:?}`: {expected}"));
        };
        let failures: u32 = failures.trim().parse().map_err(|_| {
            format!("invalid retry limit `{text:?}`: `{failures}` is not a count of failures; {expected}")
        })?;
        if failures == 0 {
            return Err(format!(
                "invalid retry limit `{text:?}`: it allows no failure, so no call would run; allow at least 1, or write `\"off\"`"
            ));
        }
        let window = match humantime::parse_duration(window.trim()) {
            Ok(window) if !window.is_zero() => window,
            _ => {
                return Err(format!(
                    "invalid retry limit `{text:?}`: `{window}` is not a window; {expected}"
                ))
            }
        };
        Ok(RetryLimit::after(failures, window))
    }
}

impl fmt::Display for RetryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            LimitKind::Toolbox => f.write_str("the toolbox's"),
            LimitKind::Off => f.write_str("off"),
            LimitKind::After { failures, window } => {
                write!(f, "{failures}/{}", humantime::format_duration(window))
            }
        }
    }
}
