//! A store that fails on purpose: wrap any [`Store`] to test what callers do when it is slow,
//! unreachable, or applies a write and loses the reply.
//!
//! Each operation passes through a [`Plan`] that decides its fate: go through, fail before it is
//! applied ([`Fault::FailBefore`]), be applied and then answer [`StoreError::Unavailable`] as a
//! dropped connection would ([`Fault::LoseReply`]), or be delayed before it is applied
//! ([`Fault::Delay`]) or after ([`Fault::DelayReply`]); a script may also make one panic, as a
//! store with a bug would ([`Fault::Panic`]). A plan is random from a seed, so a failing run
//! replays exactly, or a script of the faults to inject, in order. [`FaultyStore::stop`] ends
//! the faults, as a network that heals:
//!
//! ```
//! use std::time::Duration;
//! use toolkey::store::faults::{Fault, FaultyStore, Op, Plan};
//! use toolkey::store::{MemoryStore, RecordKey, Reservation, Reservations, StoreError, Token};
//! use toolkey::Fingerprint;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // The first reserve is applied and its reply lost.
//! let store = FaultyStore::new(
//!     MemoryStore::new(),
//!     Plan::script([(Op::Reserve, Fault::LoseReply)]),
//! );
//! let key = RecordKey::new("tenant", "invoice:acme");
//! let fp = Fingerprint::of(&serde_json::json!({"amount": 5})).unwrap();
//! let lease = Duration::from_secs(30);
//! assert!(matches!(
//!     store.reserve(&key, "tool", &fp, &Token::generate(), lease).await,
//!     Err(StoreError::Unavailable(_))
//! ));
//! // The write happened: the key is held by a reservation nobody was told about.
//! assert!(matches!(
//!     store.reserve(&key, "tool", &fp, &Token::generate(), lease).await,
//!     Ok(Reservation::Existing(_))
//! ));
//! assert_eq!(store.injected().lost_replies, 1);
//!
//! // Random faults from a seed: one operation in ten fails before it applies.
//! let store = FaultyStore::new(MemoryStore::new(), Plan::random(7).fail_before(0.1));
//! store.stop(); // no more faults from here on
//! # }
//! ```

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::{
    Cursor, FailureCounters, Filter, OperatorCommands, Outcome, Page, Record, RecordKey,
    Reservation, Reservations, Resolution, Store, StoreError, Token,
};
use crate::Fingerprint;

/// A store operation, as a [`Plan`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// [`Reservations::reserve`].
    Reserve,
    /// [`Reservations::complete`].
    Complete,
    /// [`Reservations::release`].
    Release,
    /// [`Reservations::renew`].
    Renew,
    /// [`Reservations::mark_unknown`].
    MarkUnknown,
    /// [`Reservations::take_over`].
    TakeOver,
    /// [`Reservations::get`].
    Get,
    /// [`OperatorCommands::purge_expired`].
    PurgeExpired,
    /// [`OperatorCommands::now`].
    Now,
    /// [`OperatorCommands::list`].
    List,
    /// [`OperatorCommands::resolve`].
    Resolve,
    /// [`FailureCounters::count_failure`].
    CountFailure,
    /// [`FailureCounters::failures`].
    Failures,
    /// [`FailureCounters::clear_failures`].
    ClearFailures,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 14] = [
        Op::Reserve,
        Op::Complete,
        Op::Release,
        Op::Renew,
        Op::MarkUnknown,
        Op::TakeOver,
        Op::Get,
        Op::PurgeExpired,
        Op::Now,
        Op::List,
        Op::Resolve,
        Op::CountFailure,
        Op::Failures,
        Op::ClearFailures,
    ];

    fn index(self) -> usize {
        Op::ALL
            .iter()
            .position(|op| *op == self)
            .expect("every op is in ALL")
    }

    /// True for the operations that write.
    pub fn writes(self) -> bool {
        !matches!(self, Op::Get | Op::Now | Op::List | Op::Failures)
    }
}

/// What happens to one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The operation is not applied; the caller gets [`StoreError::Unavailable`].
    FailBefore,
    /// The operation is applied; the caller gets [`StoreError::Unavailable`] instead of its
    /// answer, as when the connection drops on the way back.
    LoseReply,
    /// The operation waits this long (tokio time), then is applied and answered.
    Delay(Duration),
    /// The operation is applied at once; its answer arrives this long after.
    DelayReply(Duration),
    /// The operation panics before it is applied, as a store with a bug would (counted with
    /// [`Injected::failed_before`]).
    Panic,
}

/// Decides the fate of each operation: random from a seed, or scripted.
#[derive(Debug)]
pub struct Plan {
    kind: PlanKind,
}

#[derive(Debug)]
enum PlanKind {
    Random(Random),
    Script(VecDeque<(Op, Fault)>),
}

#[derive(Debug)]
struct Random {
    rng: fastrand::Rng,
    ops: Vec<Op>,
    fail_before: f64,
    lose_reply: f64,
    delay: f64,
    max_delay: Duration,
}

impl Plan {
    /// Faults drawn from a random generator seeded with `seed`: the same seed and the same
    /// sequence of operations give the same faults. No fault until a rate is set.
    pub fn random(seed: u64) -> Plan {
        Plan {
            kind: PlanKind::Random(Random {
                rng: fastrand::Rng::with_seed(seed),
                ops: Op::ALL.to_vec(),
                fail_before: 0.0,
                lose_reply: 0.0,
                delay: 0.0,
                max_delay: Duration::ZERO,
            }),
        }
    }

    /// The faults to inject, in order: each applies to the next operation of its kind; every
    /// other operation goes through.
    pub fn script(faults: impl IntoIterator<Item = (Op, Fault)>) -> Plan {
        Plan {
            kind: PlanKind::Script(faults.into_iter().collect()),
        }
    }

    /// A random plan fails this share of operations (0.0 to 1.0) before they apply.
    pub fn fail_before(mut self, rate: f64) -> Plan {
        if let PlanKind::Random(r) = &mut self.kind {
            r.fail_before = rate;
        }
        self
    }

    /// A random plan applies this share of operations and loses their reply.
    pub fn lose_reply(mut self, rate: f64) -> Plan {
        if let PlanKind::Random(r) = &mut self.kind {
            r.lose_reply = rate;
        }
        self
    }

    /// A random plan delays this share of operations by up to `max` (half before they apply,
    /// half after).
    pub fn delay(mut self, rate: f64, max: Duration) -> Plan {
        if let PlanKind::Random(r) = &mut self.kind {
            r.delay = rate;
            r.max_delay = max;
        }
        self
    }

    /// A random plan touches only these operations (all of them unless set).
    pub fn only(mut self, ops: impl IntoIterator<Item = Op>) -> Plan {
        if let PlanKind::Random(r) = &mut self.kind {
            r.ops = ops.into_iter().collect();
        }
        self
    }

    fn decide(&mut self, op: Op) -> Option<Fault> {
        match &mut self.kind {
            PlanKind::Script(faults) => {
                let at = faults.iter().position(|(o, _)| *o == op)?;
                faults.remove(at).map(|(_, fault)| fault)
            }
            PlanKind::Random(r) => {
                if !r.ops.contains(&op) {
                    return None;
                }
                let roll = r.rng.f64();
                if roll < r.fail_before {
                    Some(Fault::FailBefore)
                } else if roll < r.fail_before + r.lose_reply {
                    Some(Fault::LoseReply)
                } else if roll < r.fail_before + r.lose_reply + r.delay {
                    let max = r.max_delay.as_millis().max(1) as u64;
                    let d = Duration::from_millis(r.rng.u64(1..=max));
                    Some(if r.rng.bool() {
                        Fault::Delay(d)
                    } else {
                        Fault::DelayReply(d)
                    })
                } else {
                    None
                }
            }
        }
    }
}

/// How many faults a [`FaultyStore`] injected, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Injected {
    /// Operations failed before they applied.
    pub failed_before: u64,
    /// Operations applied whose reply was lost.
    pub lost_replies: u64,
    /// Operations delayed (before they applied or after).
    pub delayed: u64,
}

impl Injected {
    /// All faults together.
    pub fn total(&self) -> u64 {
        self.failed_before + self.lost_replies + self.delayed
    }
}

/// A [`Store`] over another, injecting the faults its [`Plan`] decides until
/// [`FaultyStore::stop`].
#[derive(Debug)]
pub struct FaultyStore<S> {
    inner: S,
    plan: Mutex<Plan>,
    stopped: AtomicBool,
    injected: Mutex<Injected>,
    calls: [AtomicU64; Op::ALL.len()],
}

impl<S: Store> FaultyStore<S> {
    /// `inner`, failing as `plan` says.
    pub fn new(inner: S, plan: Plan) -> Self {
        FaultyStore {
            inner,
            plan: Mutex::new(plan),
            stopped: AtomicBool::new(false),
            injected: Mutex::default(),
            calls: Default::default(),
        }
    }

    /// How many times `op` was called, faulted or not: a test counts round trips with it.
    pub fn calls(&self, op: Op) -> u64 {
        self.calls[op.index()].load(Ordering::SeqCst)
    }

    /// How many operations were called, every kind together.
    pub fn all_calls(&self) -> u64 {
        Op::ALL.iter().map(|op| self.calls(*op)).sum()
    }

    /// No more faults: every operation from now on goes straight to the inner store.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }

    /// Faults again, as the plan decides (after [`FaultyStore::stop`]).
    pub fn resume(&self) {
        self.stopped.store(false, Ordering::SeqCst);
    }

    /// The faults injected so far.
    pub fn injected(&self) -> Injected {
        *self.injected.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The store underneath, without faults.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn decide(&self, op: Op) -> Option<Fault> {
        if self.stopped.load(Ordering::SeqCst) {
            return None;
        }
        let fault = self
            .plan
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .decide(op)?;
        let mut injected = self.injected.lock().unwrap_or_else(|e| e.into_inner());
        match fault {
            Fault::FailBefore | Fault::Panic => injected.failed_before += 1,
            Fault::LoseReply => injected.lost_replies += 1,
            Fault::Delay(_) | Fault::DelayReply(_) => injected.delayed += 1,
        }
        Some(fault)
    }

    /// Runs `apply` as the plan decides for `op`.
    async fn run<T>(
        &self,
        op: Op,
        apply: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.calls[op.index()].fetch_add(1, Ordering::SeqCst);
        match self.decide(op) {
            None => apply.await,
            Some(Fault::FailBefore) => Err(lost(op, "before it was applied")),
            Some(Fault::LoseReply) => {
                let _ = apply.await;
                Err(lost(op, "after it was applied"))
            }
            Some(Fault::Delay(d)) => {
                tokio::time::sleep(d).await;
                apply.await
            }
            Some(Fault::DelayReply(d)) => {
                let answer = apply.await;
                tokio::time::sleep(d).await;
                answer
            }
            Some(Fault::Panic) => panic!("injected fault: {op:?} panicked before it was applied"),
        }
    }
}

fn lost(op: Op, when: &str) -> StoreError {
    StoreError::Unavailable(format!("injected fault: {op:?} lost its connection {when}"))
}

#[async_trait]
impl<S: Store> Reservations for FaultyStore<S> {
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        self.run(
            Op::Reserve,
            self.inner.reserve(key, tool, fingerprint, token, lease),
        )
        .await
    }
    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError> {
        self.run(
            Op::Complete,
            self.inner.complete(key, token, outcome, retain),
        )
        .await
    }
    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        self.run(Op::Release, self.inner.release(key, token)).await
    }
    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.run(Op::Renew, self.inner.renew(key, token, lease))
            .await
    }
    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        self.run(Op::MarkUnknown, self.inner.mark_unknown(key, token))
            .await
    }
    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError> {
        self.run(Op::TakeOver, self.inner.take_over(key, stale, lease))
            .await
    }
    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.run(Op::Get, self.inner.get(key)).await
    }
}

#[async_trait]
impl<S: Store> OperatorCommands for FaultyStore<S> {
    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        self.run(Op::PurgeExpired, self.inner.purge_expired(limit))
            .await
    }
    async fn now(&self) -> Result<SystemTime, StoreError> {
        self.run(Op::Now, self.inner.now()).await
    }
    async fn list(
        &self,
        filter: &Filter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        self.run(Op::List, self.inner.list(filter, cursor, limit))
            .await
    }
    async fn resolve(
        &self,
        key: &RecordKey,
        seen: &Token,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        self.run(Op::Resolve, self.inner.resolve(key, seen, resolution))
            .await
    }
}

#[async_trait]
impl<S: Store> FailureCounters for FaultyStore<S> {
    async fn count_failure(&self, key: &RecordKey, window: Duration) -> Result<u64, StoreError> {
        self.run(Op::CountFailure, self.inner.count_failure(key, window))
            .await
    }
    async fn failures(&self, key: &RecordKey) -> Result<u64, StoreError> {
        self.run(Op::Failures, self.inner.failures(key)).await
    }
    async fn clear_failures(&self, key: &RecordKey) -> Result<(), StoreError> {
        self.run(Op::ClearFailures, self.inner.clear_failures(key))
            .await
    }
}

// Approval requests pass through untouched: the faults injected are the call path's.
impl<S: Store> crate::store::Approvals for FaultyStore<S> {
    crate::store::forward!(Approvals to inner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use serde_json::json;

    fn key() -> RecordKey {
        RecordKey::new("t", "k")
    }

    fn fp() -> Fingerprint {
        Fingerprint::of(&json!(1)).unwrap()
    }

    #[tokio::test]
    async fn a_failure_before_applies_nothing_and_a_lost_reply_applies() {
        let store = FaultyStore::new(
            MemoryStore::new(),
            Plan::script([
                (Op::Reserve, Fault::FailBefore),
                (Op::Reserve, Fault::LoseReply),
            ]),
        );
        let lease = Duration::from_secs(30);
        assert!(store
            .reserve(&key(), "tool", &fp(), &Token::generate(), lease)
            .await
            .is_err());
        assert_eq!(store.inner().get(&key()).await.unwrap(), None);
        assert!(store
            .reserve(&key(), "tool", &fp(), &Token::generate(), lease)
            .await
            .is_err());
        assert!(matches!(
            store.inner().get(&key()).await.unwrap(),
            Some(Record::InProgress { .. })
        ));
        assert_eq!(
            store.injected(),
            Injected {
                failed_before: 1,
                lost_replies: 1,
                delayed: 0
            }
        );
    }

    #[tokio::test]
    async fn a_script_applies_to_the_next_operation_of_its_kind() {
        let store = FaultyStore::new(
            MemoryStore::new(),
            Plan::script([(Op::Release, Fault::FailBefore)]),
        );
        let Reservation::Reserved { token, .. } = store
            .reserve(
                &key(),
                "tool",
                &fp(),
                &Token::generate(),
                Duration::from_secs(30),
            )
            .await
            .unwrap()
        else {
            panic!("reserved")
        };
        assert!(store.release(&key(), &token).await.is_err());
        assert!(store.release(&key(), &token).await.unwrap());
    }

    #[tokio::test]
    async fn one_seed_gives_one_sequence_of_faults_and_stop_ends_them() {
        let faults = |seed| async move {
            let store = FaultyStore::new(
                MemoryStore::new(),
                Plan::random(seed).fail_before(0.3).lose_reply(0.3),
            );
            let mut seen = Vec::new();
            for _ in 0..50 {
                seen.push(store.get(&key()).await.is_err());
            }
            store.stop();
            for _ in 0..50 {
                assert!(store.get(&key()).await.is_ok());
            }
            (seen, store.injected().total())
        };
        let (a, n) = faults(11).await;
        assert_eq!(a, faults(11).await.0);
        assert_ne!(a, faults(12).await.0);
        assert_eq!(n as usize, a.iter().filter(|&&e| e).count());
        assert!(n > 10 && n < 50, "about 60% of 50: {n}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_delay_waits_in_tokio_time() {
        let store = FaultyStore::new(
            MemoryStore::new(),
            Plan::script([(Op::Get, Fault::Delay(Duration::from_secs(5)))]),
        );
        let start = tokio::time::Instant::now();
        store.get(&key()).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert_eq!(store.injected().delayed, 1);
    }
}
