//! What a retry check found: one row per scenario, printed as a table.

use std::fmt;

/// One failure of the catalogue, as a [`RetryCheck`](super::RetryCheck) produces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scenario {
    /// The same call twice: the second is a replay of the first.
    Replay,
    /// The caller times out while the body goes on; it retries, then asks the status tool.
    Timeout,
    /// The caller times out, and the model asks again as a new tool call, at the next step of
    /// its run (as the [provider adapters](crate::providers) number calls); once the body
    /// ended, again. A key on the call's place in the run (`<ctx.step>`) gives each such call
    /// a key of its own: the kit cannot judge that tool, and says so.
    ModelRetry,
    /// A retry that rewords every `#[arg(ignore)]` field and respells key fields only as their
    /// normalization allows (and the rewordings given with
    /// [`reworded`](super::RetryCheck::reworded)): replays.
    Reworded,
    /// A retry under the same key with another value of a fingerprinted argument: `CONFLICT`.
    OtherArguments,
    /// Duplicates of one call at the same time: one runs.
    Concurrent,
    /// The store applies the record write after the effect and loses its reply: the outcome is
    /// kept and replayed.
    LostReply,
    /// The store fails each write of the call once, in turn — the tool's reservation, each
    /// `ctx.once` step's reservation and record, the tool's record — first before applying it,
    /// then applying it and losing its reply; the model retries: one effect.
    StoreFails,
    /// The worker dies at the tool's own record write, after the effect; after its lease
    /// lapses another worker gets the call: the recover hook finds the effect, or the answer
    /// says unknown.
    Crash,
    /// The worker dies at each write of each `ctx.once` step in turn (its reservation, its
    /// record); after its lease lapses another worker gets the call: the effect is done once,
    /// or the answer says unknown.
    CrashAtStep,
    /// The worker dies after it reserved the key, before its body acted; after its lease lapses
    /// another worker gets the call: the recover hook finds nothing and the retry acts, or the
    /// answer says unknown. A hook that answers "found" without looking fails here.
    CrashBeforeEffect,
    /// The body is slow after its effect and its renewals do not reach the store, so its lease
    /// lapses; another worker gets the call meanwhile.
    LeaseLapse,
    /// Another action (given with [`other_action`](super::RetryCheck::other_action)) after
    /// the first: it runs too.
    OtherAction,
}

impl Scenario {
    /// Every scenario, in the order a check runs them.
    pub const ALL: [Scenario; 13] = [
        Scenario::Replay,
        Scenario::Timeout,
        Scenario::ModelRetry,
        Scenario::Reworded,
        Scenario::OtherArguments,
        Scenario::Concurrent,
        Scenario::LostReply,
        Scenario::StoreFails,
        Scenario::Crash,
        Scenario::CrashAtStep,
        Scenario::CrashBeforeEffect,
        Scenario::LeaseLapse,
        Scenario::OtherAction,
    ];

    /// The scenario's name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Replay => "same call again",
            Scenario::Timeout => "timeout, retry, status",
            Scenario::ModelRetry => "model asks again",
            Scenario::Reworded => "reworded retry",
            Scenario::OtherArguments => "retry, other arguments",
            Scenario::Concurrent => "concurrent duplicates",
            Scenario::LostReply => "record reply lost",
            Scenario::StoreFails => "store fails at a write",
            Scenario::Crash => "crash before record",
            Scenario::CrashAtStep => "crash at a step's write",
            Scenario::CrashBeforeEffect => "crash before effect",
            Scenario::LeaseLapse => "lease lapses, slow body",
            Scenario::OtherAction => "another action",
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a scenario held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// The effects were as expected and every answer was true.
    Pass,
    /// Work done twice, work skipped, or an answer that misleads the model.
    Fail,
    /// The kit cannot tell whether the tool is safe here (its reason says why): never "safe".
    /// A tool keyed on its place in the run (`<ctx.step>`) is the case: toolkey takes the
    /// model's retry for a new action, as it takes a second request.
    CannotJudge,
    /// The scenario had nothing to try (its reason says what would let it run).
    NotRun,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "FAIL",
            Verdict::CannotJudge => "CANNOT JUDGE",
            Verdict::NotRun => "not run",
        })
    }
}

/// One scenario's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Row {
    /// Which scenario.
    pub scenario: Scenario,
    /// The effects a retry-safe tool makes in it.
    pub expected: usize,
    /// The effects the counter saw.
    pub observed: usize,
    /// The answers the model got, in order, by code (`ok`, `replayed`, `TIMEOUT`, ...).
    pub answer: String,
    /// Whether it held.
    pub verdict: Verdict,
    /// For a failing row, what went wrong and why; for a row not run or not judged, why not;
    /// for a row that held, a note on how (an unknown outcome for want of a recover hook).
    pub reason: Option<String>,
}

impl Row {
    pub(crate) fn new(scenario: Scenario, expected: usize, observed: usize) -> Row {
        Row {
            scenario,
            expected,
            observed,
            answer: String::new(),
            verdict: Verdict::Pass,
            reason: None,
        }
    }

    pub(crate) fn not_run(scenario: Scenario, why: impl Into<String>) -> Row {
        Row {
            verdict: Verdict::NotRun,
            reason: Some(why.into()),
            ..Row::new(scenario, 0, 0)
        }
    }

    pub(crate) fn answer(mut self, answer: impl Into<String>) -> Row {
        self.answer = answer.into();
        self
    }

    pub(crate) fn note(&mut self, note: impl Into<String>) {
        if self.verdict == Verdict::Pass {
            self.reason = Some(note.into());
        }
    }

    /// Fails the row with `why`, unless it already failed (the first reason is the cause).
    pub(crate) fn fail(&mut self, why: impl Into<String>) {
        if self.verdict != Verdict::Fail {
            self.verdict = Verdict::Fail;
            self.reason = Some(why.into());
        }
    }

    /// Says the kit cannot judge the row, unless it already failed or was not judged.
    pub(crate) fn cannot_judge(&mut self, why: impl Into<String>) {
        if matches!(self.verdict, Verdict::Pass | Verdict::NotRun) {
            self.verdict = Verdict::CannotJudge;
            self.reason = Some(why.into());
        }
    }
}

/// Every scenario's row for one tool on one store.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// The tool checked.
    pub tool: String,
    /// The store it ran on (`memory`, `sqlite`, ...).
    pub store: String,
    /// One row per scenario, in [`Scenario::ALL`]'s order.
    pub rows: Vec<Row>,
}

impl Report {
    /// True when no row failed and every row run was judged: the tool is retry-safe as far as
    /// the catalogue goes.
    pub fn passed(&self) -> bool {
        self.failures().next().is_none() && self.unjudged().next().is_none()
    }

    /// The failing rows.
    pub fn failures(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| r.verdict == Verdict::Fail)
    }

    /// The rows the kit could not judge.
    pub fn unjudged(&self) -> impl Iterator<Item = &Row> {
        self.rows
            .iter()
            .filter(|r| r.verdict == Verdict::CannotJudge)
    }

    /// The row of one scenario.
    pub fn row(&self, scenario: Scenario) -> Option<&Row> {
        self.rows.iter().find(|r| r.scenario == scenario)
    }

    /// Panics with the whole table unless every scenario held: the assertion a test ends with.
    /// A row the kit could not judge fails it too: the kit never calls such a tool safe.
    #[track_caller]
    pub fn assert_retry_safe(&self) {
        if self.failures().next().is_some() {
            panic!("`{}` is not retry-safe\n\n{self}", self.tool);
        }
        if !self.passed() {
            panic!(
                "`{}` cannot be judged retry-safe by this check\n\n{self}",
                self.tool
            );
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failed = self.failures().count();
        let unjudged = self.unjudged().count();
        let mut verdict = match failed {
            0 if unjudged == 0 => "every scenario held".to_string(),
            0 => String::new(),
            1 => "1 scenario FAILED".to_string(),
            n => format!("{n} scenarios FAILED"),
        };
        if unjudged > 0 {
            let sep = if failed > 0 { ", " } else { "" };
            let rows = if unjudged == 1 {
                "scenario"
            } else {
                "scenarios"
            };
            verdict.push_str(&format!("{sep}{unjudged} {rows} it CANNOT JUDGE"));
        }
        writeln!(
            f,
            "retry check of `{}` on the {} store: {verdict}",
            self.tool, self.store,
        )?;
        let head = ["scenario", "expected", "observed", "answer", "verdict"];
        let cells: Vec<[String; 5]> = self
            .rows
            .iter()
            .map(|r| {
                let count = |n: usize| {
                    if r.verdict == Verdict::NotRun {
                        "-".to_string()
                    } else {
                        n.to_string()
                    }
                };
                [
                    r.scenario.name().to_string(),
                    count(r.expected),
                    count(r.observed),
                    r.answer.clone(),
                    r.verdict.to_string(),
                ]
            })
            .collect();
        let width = |i: usize| {
            cells
                .iter()
                .map(|c| c[i].chars().count())
                .chain([head[i].len()])
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..5).map(width).collect();
        let line = |f: &mut fmt::Formatter<'_>, cells: [&str; 5]| {
            writeln!(
                f,
                "  {:<w0$}  {:>w1$}  {:>w2$}  {:<w3$}  {}",
                cells[0],
                cells[1],
                cells[2],
                cells[3],
                cells[4],
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2],
                w3 = widths[3],
            )
        };
        line(f, head)?;
        for (row, cells) in self.rows.iter().zip(&cells) {
            line(f, [&cells[0], &cells[1], &cells[2], &cells[3], &cells[4]])?;
            if let Some(reason) = &row.reason {
                let mark = match row.verdict {
                    Verdict::Fail => "FAIL",
                    Verdict::CannotJudge => "CANNOT JUDGE",
                    Verdict::Pass | Verdict::NotRun => "note",
                };
                writeln!(f, "      {mark}: {reason}")?;
            }
        }
        Ok(())
    }
}
