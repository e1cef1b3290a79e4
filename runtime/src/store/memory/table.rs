//! The memory store's table: open addressing with linear probing, each slot a record's hash
//! beside the pointer to it.
//!
//! Why not `hashbrown`: a Swiss table keeps its control bytes and its slots in two arrays, so a
//! reserve of a fresh key in a large table meets two cache misses one after the other (the
//! control group, then the slot written), and a control byte that matches by chance costs a
//! third, the record's own. Here a fresh key's probe reads the slots from its home on, at most
//! half full, so it mostly ends within its home's cache line, whose address the hash alone
//! gives: a reserve asks for that line ([`Table::prefetch`]) before it builds the record, and
//! probes once ([`Table::entry`]) both to find a record and to place one. A full hash in each
//! slot settles a probe without reading a record except on a true match.

use std::mem;

/// One slot: empty, or a record and its hash.
struct Slot<T> {
    hash: u64,
    item: Option<Box<T>>,
}

impl<T> Slot<T> {
    const EMPTY: Slot<T> = Slot {
        hash: 0,
        item: None,
    };
}

/// What [`Table::entry`] found: the record, or the place for one.
pub(super) enum Entry<'a, T> {
    Held(&'a mut T),
    Free(Free<'a, T>),
}

/// The place for a record that a probe did not find.
pub(super) struct Free<'a, T> {
    table: &'a mut Table<T>,
    hash: u64,
    /// The empty slot the probe ended on.
    empty: Option<usize>,
}

impl<T> Free<'_, T> {
    /// Puts `item` in the place: the slot the probe ended on, unless the table must grow first.
    pub(super) fn insert(self, item: T) {
        let Free { table, hash, empty } = self;
        let item = Box::new(item);
        match empty {
            Some(at) if (table.len + 1) * 2 <= table.slots.len() => {
                table.slots[at] = Slot {
                    hash,
                    item: Some(item),
                };
            }
            _ => {
                table.grow();
                table.place(hash, item);
            }
        }
        table.len += 1;
    }
}

/// Records found by a 64-bit hash and an equality the caller gives.
pub(super) struct Table<T> {
    /// A power of two slots long, or empty.
    slots: Box<[Slot<T>]>,
    len: usize,
}

/// The fewest slots a table that holds anything has.
const MIN_SLOTS: usize = 16;

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table {
            slots: Box::default(),
            len: 0,
        }
    }
}

impl<T> Table<T> {
    /// How many records it holds.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// Where a probe for `hash` starts.
    fn home(&self, hash: u64) -> usize {
        // The low bits, as a Swiss table takes them: foldhash mixes them as well as the high.
        hash as usize & self.mask()
    }

    /// Asks the processor for the cache line where a probe for `hash` starts, so that work done
    /// before the probe overlaps the wait for it. Only a hint: nothing is read.
    #[inline]
    pub(super) fn prefetch(&self, hash: u64) {
        if self.slots.is_empty() {
            return;
        }
        let slot: *const Slot<T> = &self.slots[self.home(hash)];
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch reads nothing and cannot fault; the pointer is in the slots.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(slot.cast());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = slot;
    }

    /// The slot holding the record hashed `hash` that `is` takes (`Ok`), or else the empty slot
    /// where the probe ended (`Err`; none in a table without slots).
    fn probe(&self, hash: u64, mut is: impl FnMut(&T) -> bool) -> Result<usize, Option<usize>> {
        if self.slots.is_empty() {
            return Err(None);
        }
        let mask = self.mask();
        let mut at = self.home(hash);
        loop {
            let slot = &self.slots[at];
            match &slot.item {
                None => return Err(Some(at)),
                Some(item) if slot.hash == hash && is(item) => return Ok(at),
                Some(_) => at = (at + 1) & mask,
            }
        }
    }

    /// The record hashed `hash` that `is` takes.
    pub(super) fn find_mut(&mut self, hash: u64, is: impl FnMut(&T) -> bool) -> Option<&mut T> {
        let at = self.probe(hash, is).ok()?;
        self.slots[at].item.as_deref_mut()
    }

    /// The record hashed `hash` that `is` takes, to read or replace, or else the place for one:
    /// one probe for both.
    pub(super) fn entry(&mut self, hash: u64, is: impl FnMut(&T) -> bool) -> Entry<'_, T> {
        match self.probe(hash, is) {
            Ok(at) => match self.slots[at].item.as_deref_mut() {
                Some(held) => Entry::Held(held),
                None => unreachable!("a probe ends on a record it found"),
            },
            Err(empty) => Entry::Free(Free {
                table: self,
                hash,
                empty,
            }),
        }
    }

    /// Puts `item` in the first empty slot from its home on (there is one: the table is never
    /// full).
    fn place(&mut self, hash: u64, item: Box<T>) {
        let mask = self.mask();
        let mut at = self.home(hash);
        while self.slots[at].item.is_some() {
            at = (at + 1) & mask;
        }
        self.slots[at] = Slot {
            hash,
            item: Some(item),
        };
    }

    /// Twice the slots (at least [`MIN_SLOTS`]), each record placed again by its hash.
    fn grow(&mut self) {
        let wanted = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = mem::replace(&mut self.slots, empty_slots(wanted));
        for slot in old.into_vec() {
            if let Some(item) = slot.item {
                self.place(slot.hash, item);
            }
        }
    }

    /// Removes the record hashed `hash` that `is` takes, if `judge` says so; true when it did.
    pub(super) fn remove_if(
        &mut self,
        hash: u64,
        is: impl FnMut(&T) -> bool,
        judge: impl FnOnce(&T) -> bool,
    ) -> bool {
        let Ok(at) = self.probe(hash, is) else {
            return false;
        };
        if !self.slots[at].item.as_deref().is_some_and(judge) {
            return false;
        }
        self.remove_at(at);
        true
    }

    /// Empties slot `hole`, then moves back each record after it that a probe from its home
    /// would no longer reach, so that no probe stops short of a record (deletion without
    /// tombstones).
    fn remove_at(&mut self, mut hole: usize) {
        let mask = self.mask();
        self.slots[hole] = Slot::EMPTY;
        self.len -= 1;
        let mut next = (hole + 1) & mask;
        while self.slots[next].item.is_some() {
            let home = self.home(self.slots[next].hash);
            // The record at `next` may fill the hole when its home is not in (hole, next],
            // cyclically: a probe from its home passes the hole on its way.
            if (next.wrapping_sub(home) & mask) >= (next.wrapping_sub(hole) & mask) {
                self.slots.swap(hole, next);
                hole = next;
            }
            next = (next + 1) & mask;
        }
    }

    /// Keeps only the records `keep` takes, asking once of each, in place: a purge of a few
    /// records from a large table moves only the records after each one removed.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        if self.len == 0 {
            return;
        }
        let mask = self.mask();
        // From an empty slot round to it: no probe runs across it, so a removal's backward
        // shift moves into the slot just asked about only records not yet asked about.
        let Some(start) = self.slots.iter().position(|slot| slot.item.is_none()) else {
            unreachable!("the table is at most half full")
        };
        let mut at = (start + 1) & mask;
        while at != start {
            match &self.slots[at].item {
                Some(item) if !keep(item) => self.remove_at(at),
                _ => at = (at + 1) & mask,
            }
        }
    }

    /// Every record, in no order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|slot| slot.item.as_deref())
    }
}

/// `len` empty slots (a power of two), zeroed by the allocator: an empty slot is all zeros, so
/// the pages of a large table are taken from the system only as records land on them. On Linux a
/// table of several megabytes asks for huge pages, so that probes into it do not miss the TLB
/// each time.
fn empty_slots<T>(len: usize) -> Box<[Slot<T>]> {
    debug_assert!(len.is_power_of_two());
    let layout = std::alloc::Layout::array::<Slot<T>>(len).expect("a table that fits in memory");
    // SAFETY: the layout is not empty (a slot is 16 bytes, `len` at least one). A slot of zeros
    // is an empty slot: a zero hash and `None`, which a null pointer is for `Option<Box<_>>`.
    // The allocation is the global allocator's with the layout of `len` slots, as a boxed slice
    // of them frees it.
    let slots = unsafe {
        let raw = std::alloc::alloc_zeroed(layout);
        if raw.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            raw.cast::<Slot<T>>(),
            len,
        ))
    };
    advise_huge_pages(&slots);
    slots
}

#[cfg(target_os = "linux")]
fn advise_huge_pages<T>(slots: &[T]) {
    const HUGE: usize = 2 << 20;
    let bytes = mem::size_of_val(slots);
    if bytes < 2 * HUGE {
        return;
    }
    let start = slots.as_ptr() as usize;
    // The whole huge pages inside the slots: advice about memory that is not the table's own
    // would touch other allocations.
    let first = start.next_multiple_of(HUGE);
    let end = (start + bytes) / HUGE * HUGE;
    if end > first {
        // SAFETY: the range lies inside the slots' allocation, and MADV_HUGEPAGE changes how
        // its pages are backed, never what they hold.
        unsafe {
            libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages<T>(_: &[T]) {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    impl<T> Table<T> {
        /// `item` in the place of the record `is` takes, or beside the others.
        fn put(&mut self, hash: u64, item: T, is: impl FnMut(&T) -> bool) {
            match self.entry(hash, is) {
                Entry::Held(held) => *held = item,
                Entry::Free(free) => free.insert(item),
            }
        }
    }

    /// Keys whose hashes all share their low bits, so that probes run long and wrap around the
    /// table's end, checked against a `HashMap` through puts, replacements, removals and
    /// retains.
    #[test]
    fn every_operation_agrees_with_a_map_under_colliding_hashes() {
        // A fixed sequence (xorshift), so a failure repeats.
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = |below: u32| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % u64::from(below)) as u32
        };
        for bits in [0u32, 2, 4, 64, 99] {
            let hash = |k: u32| -> u64 {
                let full = u64::from(k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                match bits {
                    64 => full,
                    // One hash for every key: only `is` tells them apart.
                    99 => u64::MAX,
                    // Few homes (2^bits of them), at the table's end, so probes wrap around.
                    _ => (full & !0xFFFF_FFFF) | u64::from(u32::MAX - k % (1 << bits)),
                }
            };
            let mut table: Table<(u32, u32)> = Table::default();
            let mut map: HashMap<u32, u32> = HashMap::new();
            for step in 0..20_000u32 {
                let k = next(300);
                match next(10) {
                    0..=4 => {
                        table.put(hash(k), (k, step), |(held, _)| *held == k);
                        map.insert(k, step);
                    }
                    5..=7 => {
                        let odd = step % 2 == 1;
                        let removed = table.remove_if(hash(k), |(held, _)| *held == k, |_| odd);
                        assert_eq!(removed, odd && map.contains_key(&k));
                        if odd {
                            map.remove(&k);
                        }
                    }
                    8 => {
                        let mut asked = Vec::new();
                        table.retain(|(k, _)| {
                            asked.push(*k);
                            k % 7 != 0
                        });
                        asked.sort();
                        let mut held: Vec<u32> = map.keys().copied().collect();
                        held.sort();
                        assert_eq!(asked, held, "each record asked about once");
                        map.retain(|k, _| k % 7 != 0);
                    }
                    _ => {
                        if let Some(held) = table.find_mut(hash(k), |(held, _)| *held == k) {
                            held.1 += 1;
                        }
                        if let Some(held) = map.get_mut(&k) {
                            *held += 1;
                        }
                    }
                }
                assert_eq!(table.len(), map.len());
                if step % 16 != 0 {
                    continue;
                }
                for k in 0..300 {
                    let found = table
                        .find_mut(hash(k), |(held, _)| *held == k)
                        .map(|(_, v)| *v);
                    assert_eq!(found, map.get(&k).copied(), "key {k}, step {step}");
                }
            }
            let mut all: Vec<(u32, u32)> = table.iter().copied().collect();
            all.sort();
            let mut expected: Vec<(u32, u32)> = map.into_iter().collect();
            expected.sort();
            assert_eq!(all, expected);
        }
    }

    /// The table stays at most half full, and an empty one holds no slots.
    #[test]
    fn the_table_is_at_most_half_full() {
        let mut table: Table<u64> = Table::default();
        assert_eq!(table.slots.len(), 0);
        assert!(table.find_mut(1, |_| true).is_none());
        table.prefetch(1);
        for n in 0..10_000u64 {
            table.put(n.wrapping_mul(0x9E37_79B9_7F4A_7C15), n, |held| *held == n);
            assert!(table.len() * 2 <= table.slots.len());
        }
        assert_eq!(table.len(), 10_000);
        assert_eq!(table.slots.len(), 32_768);
    }
}
