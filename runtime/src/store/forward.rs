//! [`forward!`](crate::store::forward): the roles a wrapper hands on unchanged, one line each.

/// Implements the methods of one role of a [`Store`](crate::store::Store) by handing each call
/// to the store a wrapper holds, unchanged.
///
/// A wrapper writes by hand only the roles it changes, and forwards the others inside their
/// `impl` blocks: `forward!(Role to field)` hands every method of `Role` to the store in
/// `self.field`, and `forward!(Role, |wrapper| expression)` to the store the expression borrows.
/// `Role` is one of [`Reservations`](crate::store::Reservations),
/// [`OperatorCommands`](crate::store::OperatorCommands),
/// [`FailureCounters`](crate::store::FailureCounters) or
/// [`Approvals`](crate::store::Approvals). Each forwarded operation answers the
/// inner store's own future, boxed once.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::time::Duration;
///
/// use async_trait::async_trait;
/// use toolkey::store::{
///     forward, Approvals, FailureCounters, MemoryStore, OperatorCommands, Outcome, Record, RecordKey,
///     Reservation, Reservations, Store, StoreError, Token,
/// };
/// use toolkey::Fingerprint;
///
/// /// Counts the reservations asked of the store it wraps.
/// struct Counting<S> {
///     inner: S,
///     reserves: AtomicU64,
/// }
///
/// #[async_trait]
/// impl<S: Store> Reservations for Counting<S> {
///     async fn reserve(
///         &self,
///         key: &RecordKey,
///         tool: &str,
///         fingerprint: &Fingerprint,
///         token: &Token,
///         lease: Duration,
///     ) -> Result<Reservation, StoreError> {
///         self.reserves.fetch_add(1, Ordering::Relaxed);
///         self.inner.reserve(key, tool, fingerprint, token, lease).await
///     }
///     async fn complete(
///         &self,
///         key: &RecordKey,
///         token: &Token,
///         outcome: &Outcome,
///         retain: Duration,
///     ) -> Result<bool, StoreError> {
///         self.inner.complete(key, token, outcome, retain).await
///     }
///     async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
///         self.inner.release(key, token).await
///     }
///     async fn renew(
///         &self,
///         key: &RecordKey,
///         token: &Token,
///         lease: Duration,
///     ) -> Result<bool, StoreError> {
///         self.inner.renew(key, token, lease).await
///     }
///     async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
///         self.inner.mark_unknown(key, token).await
///     }
///     async fn take_over(
///         &self,
///         key: &RecordKey,
///         stale: &Token,
///         lease: Duration,
///     ) -> Result<Option<Token>, StoreError> {
///         self.inner.take_over(key, stale, lease).await
///     }
///     async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
///         self.inner.get(key).await
///     }
/// }
///
/// // Operators and retry limits see the inner store as it is.
/// impl<S: Store> OperatorCommands for Counting<S> {
///     forward!(OperatorCommands to inner);
/// }
///
/// impl<S: Store> FailureCounters for Counting<S> {
///     forward!(FailureCounters to inner);
/// }
///
/// impl<S: Store> Approvals for Counting<S> {
///     forward!(Approvals to inner);
/// }
///
/// let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(Counting {
///     inner: MemoryStore::new(),
///     reserves: AtomicU64::new(0),
/// });
/// # drop(store);
/// ```
// Exported at the crate's root, as `macro_rules!` macros are, and named from `store` as
// `store::forward`: the facade shows it there.
#[macro_export]
macro_rules! __store_forward {
    ($role:ident to $field:ident) => {
        $crate::__store_forward!($role, |wrapper| &wrapper.$field);
    };
    (Reservations, |$this:ident| $inner:expr) => {
        $crate::__store_forward! {
            @async Reservations, |$this| $inner;
            fn reserve<'k, 't, 'f, 'o>(
                &'s self, key: &'k $crate::store::RecordKey, tool: &'t str,
                fingerprint: &'f $crate::Fingerprint, token: &'o $crate::store::Token,
                lease: ::core::time::Duration
            ) -> $crate::store::Reservation;
            fn complete<'k, 'o, 'r>(
                &'s self, key: &'k $crate::store::RecordKey, token: &'o $crate::store::Token,
                outcome: &'r $crate::store::Outcome, retain: ::core::time::Duration
            ) -> bool;
            fn release<'k, 'o>(
                &'s self, key: &'k $crate::store::RecordKey, token: &'o $crate::store::Token
            ) -> bool;
            fn renew<'k, 'o>(
                &'s self, key: &'k $crate::store::RecordKey, token: &'o $crate::store::Token,
                lease: ::core::time::Duration
            ) -> bool;
            fn mark_unknown<'k, 'o>(
                &'s self, key: &'k $crate::store::RecordKey, token: &'o $crate::store::Token
            ) -> bool;
            fn take_over<'k, 'o>(
                &'s self, key: &'k $crate::store::RecordKey, stale: &'o $crate::store::Token,
                lease: ::core::time::Duration
            ) -> ::core::option::Option<$crate::store::Token>;
            fn get<'k>(
                &'s self, key: &'k $crate::store::RecordKey
            ) -> ::core::option::Option<$crate::store::Record>;
        }

        fn completed_here(
            &self,
            key: $crate::store::RecordKeyRef<'_>,
        ) -> ::core::option::Option<$crate::store::Record> {
            let $this = self;
            $crate::store::Reservations::completed_here($inner, key)
        }
    };
    (OperatorCommands, |$this:ident| $inner:expr) => {
        $crate::__store_forward! {
            @async OperatorCommands, |$this| $inner;
            fn purge_expired<>(&'s self, limit: usize) -> u64;
            fn now<>(&'s self) -> ::std::time::SystemTime;
            fn list<'f, 'c>(
                &'s self, filter: &'f $crate::store::Filter,
                cursor: ::core::option::Option<&'c $crate::store::Cursor>, limit: usize
            ) -> $crate::store::Page;
            fn resolve<'k, 'o, 'r>(
                &'s self, key: &'k $crate::store::RecordKey, seen: &'o $crate::store::Token,
                resolution: &'r $crate::store::Resolution
            ) -> bool;
        }
    };
    (FailureCounters, |$this:ident| $inner:expr) => {
        $crate::__store_forward! {
            @async FailureCounters, |$this| $inner;
            fn count_failure<'k>(
                &'s self, key: &'k $crate::store::RecordKey, window: ::core::time::Duration
            ) -> u64;
            fn failures<'k>(&'s self, key: &'k $crate::store::RecordKey) -> u64;
            fn clear_failures<'k>(&'s self, key: &'k $crate::store::RecordKey) -> ();
        }
    };
    (Approvals, |$this:ident| $inner:expr) => {
        $crate::__store_forward! {
            @async Approvals, |$this| $inner;
            fn latest_approval<'k>(
                &'s self, id: &'k $crate::store::ApprovalKey
            ) -> ::core::option::Option<$crate::store::Approval>;
            fn open_approval<'r>(&'s self, request: &'r $crate::store::Approval) -> bool;
            fn update_approval<'r>(
                &'s self, request: &'r $crate::store::Approval, seen: $crate::store::ApprovalState
            ) -> bool;
            fn list_approvals<'t, 'a>(
                &'s self, tenant: &'t str, state: ::core::option::Option<$crate::store::ApprovalState>,
                after: ::core::option::Option<(&'a $crate::store::ApprovalKey, u64)>, limit: usize
            ) -> ::std::vec::Vec<$crate::store::Approval>;
        }
    };
    // Each method as `#[async_trait]` declares it, answering the inner store's boxed future as
    // it is: an `async fn` here would box it again.
    (@async $role:ident, |$this:ident| $inner:expr; $(
        fn $name:ident<$($l:lifetime),*>(&$s:lifetime self $(, $arg:ident: $ty:ty)*) -> $out:ty;
    )*) => {$(
        fn $name<$s, $($l,)* 'async_trait>(
            &$s self $(, $arg: $ty)*
        ) -> ::std::pin::Pin<::std::boxed::Box<
            dyn ::core::future::Future<
                Output = ::core::result::Result<$out, $crate::store::StoreError>,
            > + ::core::marker::Send + 'async_trait,
        >>
        where
            $s: 'async_trait,
            $($l: 'async_trait,)*
            Self: 'async_trait,
        {
            let $this = self;
            $crate::store::$role::$name($inner $(, $arg)*)
        }
    )*};
}
