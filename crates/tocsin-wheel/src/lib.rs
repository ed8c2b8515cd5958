//! A hierarchical timing wheel with 1 ms resolution: a pure data structure.
//!
//! The wheel never reads a clock and never does I/O. Callers pass the current
//! time (`now_ms`, any monotone millisecond scale, unix ms in Tocsin) to
//! [`Wheel::poll`], and the wheel yields every entry whose due time is at or
//! before it. This is the design of Varghese and Lauck's hierarchical wheel as
//! used by tokio-util and Kafka's purgatory.
//!
//! # Layout
//!
//! | level | slot width | level span |
//! |-------|-----------------|-----------------|
//! | 0 | 1 ms | 256 ms |
//! | 1 | 256 ms | ~65.5 s |
//! | 2 | ~65.5 s | ~4.7 h |
//! | 3 | ~4.7 h | ~49.7 days |
//! | 4 | ~49.7 days | ~34.8 years |
//! | 5 | ~34.8 years | ~8,900 years |
//!
//! Six levels of 256 slots each. An entry lives in the level of the highest
//! bit in which its due time differs from the wheel's elapsed time, so every
//! due time below [`MAX_DUE_MS`] (2^48 ms) has a place; level 4 alone spans
//! more than 34 years. 256 slots rather than tokio's 64 keep the timers of a
//! one-minute hot window within one cascade of their fire time: measured,
//! that halves the cache misses per fired entry. When the wheel reaches the start of a slot above level 0 it moves
//! that slot's entries one or more levels down ("cascades"). A level-0 slot
//! is exactly one millisecond wide, so entries leave the wheel in exact due
//! order, not merely within a tick.
//!
//! # Costs
//!
//! - insert: O(1) (a level computation and a list append);
//! - cancel: O(1) (unlink from a doubly linked slot list);
//! - poll: O(1) amortised per entry (each entry cascades at most once per
//!   level), plus O(levels) to find the next occupied slot with bitmaps.
//!
//! Entries live in one slab (`Vec`) addressed by `u32` indices with a
//! generation counter, so a stale [`Handle`] can never cancel a reused slot.
//! Each entry costs `size_of::<Entry<K>>()`: 24 bytes plus the key for small
//! keys (see `tests/integration/memory.rs` for the measured figure).
//!
//! # Overdue entries
//!
//! An entry inserted with a due time at or before the wheel's elapsed time
//! (for example while rebuilding after a failover) goes to a small binary
//! heap and is yielded by the next `poll`, earliest first, before anything
//! still in the wheel. That one path is O(log n); the steady state never
//! takes it.

#![forbid(unsafe_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Number of levels in the wheel.
pub const NUM_LEVELS: usize = 6;
/// Slots per level.
pub const SLOTS_PER_LEVEL: usize = 256;
const SLOT_BITS: u32 = 8;
/// 64-bit words in one level's occupancy bitmap.
const WORDS: usize = SLOTS_PER_LEVEL / 64;
/// The largest due time the wheel can hold: 2^48 - 1 ms.
pub const MAX_DUE_MS: u64 = (1u64 << (SLOT_BITS as usize * NUM_LEVELS)) - 1;

const NIL: u32 = u32::MAX;

/// Where an entry currently lives, packed into a `u16` so an entry stays at
/// 24 bytes plus its key: a flat slot number `level * 256 + slot` (below 1536),
/// or one of the markers below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Location(u16);

impl Location {
    const FREE: Location = Location(u16::MAX);
    /// In the FIFO of entries due exactly at the elapsed time.
    const READY: Location = Location(u16::MAX - 1);
    /// In the overdue heap.
    const OVERDUE: Location = Location(u16::MAX - 2);

    fn slot(flat: usize) -> Location {
        debug_assert!(flat < NUM_LEVELS * SLOTS_PER_LEVEL);
        Location(flat as u16)
    }

    fn as_slot(self) -> Option<usize> {
        ((self.0 as usize) < NUM_LEVELS * SLOTS_PER_LEVEL).then_some(self.0 as usize)
    }
}

#[derive(Debug)]
struct Entry<K> {
    due_ms: u64,
    prev: u32,
    next: u32,
    generation: u32,
    location: Location,
    key: Option<K>,
}

/// A doubly linked list threaded through the slab: a wheel slot or the ready
/// FIFO.
#[derive(Clone, Copy, Debug)]
struct List {
    head: u32,
    tail: u32,
}

impl List {
    const EMPTY: List = List { head: NIL, tail: NIL };

    fn is_empty(&self) -> bool {
        self.head == NIL
    }
}

/// Identifies one inserted entry; returned by [`Wheel::insert`] and consumed
/// by [`Wheel::cancel`]. A handle whose entry already left the wheel is
/// harmless: cancelling it returns `None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle {
    index: u32,
    generation: u32,
}

/// Why an insert was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertError {
    /// The due time is above [`MAX_DUE_MS`].
    BeyondHorizon,
    /// The wheel already holds `u32::MAX - 1` entries.
    Full,
}

impl std::fmt::Display for InsertError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InsertError::BeyondHorizon => write!(f, "due time is beyond the wheel horizon of {MAX_DUE_MS} ms"),
            InsertError::Full => write!(f, "the wheel is full"),
        }
    }
}

impl std::error::Error for InsertError {}

/// A hierarchical timing wheel holding keys of type `K`.
#[derive(Debug)]
pub struct Wheel<K> {
    /// The wheel's notion of "now": every entry in a slot is due after it.
    elapsed_ms: u64,
    slots: Vec<List>,
    /// One bit per non-empty slot, per level.
    occupied: [[u64; WORDS]; NUM_LEVELS],
    ready: List,
    overdue: BinaryHeap<Reverse<(u64, u32, u32)>>,
    entries: Vec<Entry<K>>,
    free_head: u32,
    len: usize,
}

impl<K> Wheel<K> {
    /// An empty wheel whose elapsed time is `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self::with_capacity(now_ms, 0)
    }

    /// An empty wheel with room for `capacity` entries before reallocating.
    pub fn with_capacity(now_ms: u64, capacity: usize) -> Self {
        Wheel {
            elapsed_ms: now_ms.min(MAX_DUE_MS),
            slots: vec![List::EMPTY; NUM_LEVELS * SLOTS_PER_LEVEL],
            occupied: [[0; WORDS]; NUM_LEVELS],
            ready: List::EMPTY,
            overdue: BinaryHeap::new(),
            entries: Vec::with_capacity(capacity),
            free_head: NIL,
            len: 0,
        }
    }

    /// Number of entries that have not yet been yielded or cancelled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the wheel holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The wheel's elapsed time: the largest `now_ms` it has been polled
    /// with (or created at).
    pub fn elapsed_ms(&self) -> u64 {
        self.elapsed_ms
    }

    /// Bytes held by the wheel's own allocations (slab, slot table, overdue
    /// heap), counting allocated capacity, not only the used part.
    pub fn allocated_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry<K>>()
            + self.slots.capacity() * std::mem::size_of::<List>()
            + self.overdue.capacity() * std::mem::size_of::<Reverse<(u64, u32, u32)>>()
    }

    /// Size in bytes of one slab entry for this key type.
    pub fn entry_size_bytes() -> usize {
        std::mem::size_of::<Entry<K>>()
    }

    /// Inserts `key` to expire at `due_ms`. A due time at or before the
    /// elapsed time is yielded by the next [`poll`](Self::poll).
    pub fn insert(&mut self, due_ms: u64, key: K) -> Result<Handle, InsertError> {
        if due_ms > MAX_DUE_MS {
            return Err(InsertError::BeyondHorizon);
        }
        let index = self.allocate(due_ms, key)?;
        self.place(index);
        self.len += 1;
        Ok(Handle { index, generation: self.entries[index as usize].generation })
    }

    /// Removes the entry behind `handle`, returning its due time and key, or
    /// `None` if it was already yielded or cancelled.
    pub fn cancel(&mut self, handle: Handle) -> Option<(u64, K)> {
        let entry = self.entries.get(handle.index as usize)?;
        if entry.generation != handle.generation {
            return None;
        }
        let location = entry.location;
        if location == Location::FREE {
            return None;
        } else if let Some(flat) = location.as_slot() {
            self.unlink_slot(handle.index, flat);
        } else if location == Location::READY {
            let mut ready = self.ready;
            self.unlink(&mut ready, handle.index);
            self.ready = ready;
        } else {
            // In the overdue heap: the heap keeps a stale (due, index, generation)
            // triple, which `pop_overdue` skips because the generation moves on.
            debug_assert_eq!(location, Location::OVERDUE);
        }
        self.len -= 1;
        Some(self.release(handle.index))
    }

    /// The due time of `handle`'s entry, if it is still pending.
    pub fn due_ms(&self, handle: Handle) -> Option<u64> {
        let entry = self.entries.get(handle.index as usize)?;
        (entry.generation == handle.generation && entry.location != Location::FREE).then_some(entry.due_ms)
    }

    /// Yields one entry whose due time is at or before `now_ms`, earliest
    /// first, or `None` when no such entry remains. Call it until it returns
    /// `None`. Never yields an entry early.
    pub fn poll(&mut self, now_ms: u64) -> Option<(u64, K)> {
        loop {
            if let Some(expired) = self.pop_overdue() {
                return Some(expired);
            }
            if !self.ready.is_empty() {
                let mut ready = self.ready;
                let index = self.pop_front(&mut ready);
                self.ready = ready;
                self.len -= 1;
                return Some(self.release(index));
            }
            // Fast path: the level-0 slot of the elapsed millisecond holds only
            // entries due exactly now (see `place`), so drain it without searching.
            let now_slot = (self.elapsed_ms % SLOTS_PER_LEVEL as u64) as usize;
            if self.elapsed_ms <= now_ms && !self.slots[now_slot].is_empty() {
                return Some(self.pop_level0(now_slot));
            }
            match self.next_expiration() {
                Some((0, slot, deadline_ms)) if deadline_ms <= now_ms => {
                    // A level-0 slot is one millisecond wide: every entry in it is due
                    // at its start, so entries leave straight from the slot.
                    debug_assert!(deadline_ms >= self.elapsed_ms, "deadline={deadline_ms} elapsed={}", self.elapsed_ms);
                    self.elapsed_ms = deadline_ms;
                    return Some(self.pop_level0(slot));
                }
                Some((level, slot, deadline_ms)) if deadline_ms <= now_ms => {
                    debug_assert!(deadline_ms >= self.elapsed_ms, "deadline={deadline_ms} elapsed={}", self.elapsed_ms);
                    self.elapsed_ms = deadline_ms;
                    self.cascade(level, slot);
                }
                _ => {
                    // Nothing is due at or before `now_ms`, so moving the elapsed time
                    // forward cannot skip an occupied slot.
                    self.elapsed_ms = self.elapsed_ms.max(now_ms.min(MAX_DUE_MS));
                    return None;
                }
            }
        }
    }

    /// The earliest time at which [`poll`](Self::poll) may yield something:
    /// the elapsed time if entries are already due, else the start of the
    /// next occupied slot (a lower bound: a slot above level 0 starts before
    /// its entries are due). `None` when the wheel is empty.
    pub fn next_poll_ms(&self) -> Option<u64> {
        if !self.overdue.is_empty() || !self.ready.is_empty() {
            return Some(self.elapsed_ms);
        }
        self.next_expiration().map(|(_, _, deadline)| deadline)
    }

    /// Every pending entry, in no particular order. Used to rebuild a wheel
    /// elsewhere and by tests.
    pub fn pending(&self) -> impl Iterator<Item = (u64, &K)> {
        self.entries
            .iter()
            .filter(|e| e.location != Location::FREE)
            .filter_map(|e| e.key.as_ref().map(|k| (e.due_ms, k)))
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = List::EMPTY);
        self.occupied = [[0; WORDS]; NUM_LEVELS];
        self.ready = List::EMPTY;
        self.overdue.clear();
        self.entries.clear();
        self.free_head = NIL;
        self.len = 0;
    }

    fn allocate(&mut self, due_ms: u64, key: K) -> Result<u32, InsertError> {
        if self.free_head != NIL {
            let index = self.free_head;
            let entry = &mut self.entries[index as usize];
            debug_assert_eq!(entry.location, Location::FREE);
            self.free_head = entry.next;
            entry.due_ms = due_ms;
            entry.prev = NIL;
            entry.next = NIL;
            entry.key = Some(key);
            return Ok(index);
        }
        let index = u32::try_from(self.entries.len()).map_err(|_| InsertError::Full)?;
        if index == NIL {
            return Err(InsertError::Full);
        }
        self.entries.push(Entry {
            due_ms,
            prev: NIL,
            next: NIL,
            generation: 0,
            location: Location::FREE,
            key: Some(key),
        });
        Ok(index)
    }

    fn release(&mut self, index: u32) -> (u64, K) {
        let entry = &mut self.entries[index as usize];
        let key = entry.key.take().expect("a live entry holds its key");
        entry.location = Location::FREE;
        entry.generation = entry.generation.wrapping_add(1);
        entry.prev = NIL;
        entry.next = self.free_head;
        self.free_head = index;
        (entry.due_ms, key)
    }

    /// Puts a (re)allocated entry where its due time says, relative to the
    /// current elapsed time.
    fn place(&mut self, index: u32) {
        let due_ms = self.entries[index as usize].due_ms;
        if due_ms <= self.elapsed_ms {
            if due_ms == self.elapsed_ms {
                // Due exactly now: FIFO order among equal due times.
                self.entries[index as usize].location = Location::READY;
                let mut ready = self.ready;
                self.push_back(&mut ready, index);
                self.ready = ready;
            } else {
                let generation = self.entries[index as usize].generation;
                self.entries[index as usize].location = Location::OVERDUE;
                self.overdue.push(Reverse((due_ms, index, generation)));
            }
            return;
        }
        let level = level_for(self.elapsed_ms, due_ms);
        let slot = slot_for(due_ms, level);
        let flat = level * SLOTS_PER_LEVEL + slot;
        self.entries[index as usize].location = Location::slot(flat);
        let mut list = self.slots[flat];
        self.push_back(&mut list, index);
        self.slots[flat] = list;
        self.occupied[level][slot / 64] |= 1 << (slot % 64);
    }

    fn pop_level0(&mut self, slot: usize) -> (u64, K) {
        let mut list = self.slots[slot];
        let index = self.pop_front(&mut list);
        self.slots[slot] = list;
        if list.is_empty() {
            clear_bit(&mut self.occupied[0], slot);
        }
        self.len -= 1;
        let expired = self.release(index);
        debug_assert_eq!(expired.0, self.elapsed_ms);
        expired
    }

    fn pop_overdue(&mut self) -> Option<(u64, K)> {
        while let Some(Reverse((_, index, generation))) = self.overdue.pop() {
            let entry = &self.entries[index as usize];
            if entry.generation == generation && entry.location == Location::OVERDUE {
                self.len -= 1;
                return Some(self.release(index));
            }
        }
        None
    }

    /// The earliest occupied slot over all levels: `(level, slot, start_ms)`.
    fn next_expiration(&self) -> Option<(usize, usize, u64)> {
        let mut best: Option<(usize, usize, u64)> = None;
        for level in 0..NUM_LEVELS {
            if let Some((slot, deadline)) = self.next_in_level(level) {
                // Lower levels win ties: their entries are due at the deadline, while a
                // higher level's slot merely starts there.
                if best.is_none_or(|(_, _, b)| deadline < b) {
                    best = Some((level, slot, deadline));
                }
            }
        }
        best
    }

    fn next_in_level(&self, level: usize) -> Option<(usize, u64)> {
        let slot_width = 1u64 << (SLOT_BITS as usize * level);
        let level_span = slot_width << SLOT_BITS;
        let now_slot = ((self.elapsed_ms / slot_width) % SLOTS_PER_LEVEL as u64) as usize;
        let slot = first_set_from(&self.occupied[level], now_slot)?;
        let level_start = self.elapsed_ms & !(level_span - 1);
        let mut deadline = level_start + slot as u64 * slot_width;
        if deadline < self.elapsed_ms {
            deadline += level_span;
        }
        Some((slot, deadline))
    }

    /// Moves every entry of a slot whose start has been reached to its place
    /// relative to the new elapsed time: a lower level, or the ready FIFO.
    fn cascade(&mut self, level: usize, slot: usize) {
        let flat = level * SLOTS_PER_LEVEL + slot;
        let list = std::mem::replace(&mut self.slots[flat], List::EMPTY);
        clear_bit(&mut self.occupied[level], slot);
        // Walk the detached list by its `next` links; `place` relinks each entry
        // into its new list, so nothing needs unlinking here.
        let mut index = list.head;
        while index != NIL {
            let next = self.entries[index as usize].next;
            debug_assert!(self.entries[index as usize].due_ms >= self.elapsed_ms);
            self.place(index);
            index = next;
        }
    }

    fn unlink_slot(&mut self, index: u32, flat: usize) {
        let mut list = self.slots[flat];
        self.unlink(&mut list, index);
        self.slots[flat] = list;
        if list.is_empty() {
            clear_bit(&mut self.occupied[flat / SLOTS_PER_LEVEL], flat % SLOTS_PER_LEVEL);
        }
    }

    fn push_back(&mut self, list: &mut List, index: u32) {
        let entry = &mut self.entries[index as usize];
        entry.prev = list.tail;
        entry.next = NIL;
        if list.tail == NIL {
            list.head = index;
        } else {
            self.entries[list.tail as usize].next = index;
        }
        list.tail = index;
    }

    fn pop_front(&mut self, list: &mut List) -> u32 {
        let index = list.head;
        debug_assert_ne!(index, NIL);
        self.unlink(list, index);
        index
    }

    fn unlink(&mut self, list: &mut List, index: u32) {
        let (prev, next) = {
            let entry = &self.entries[index as usize];
            (entry.prev, entry.next)
        };
        if prev == NIL {
            list.head = next;
        } else {
            self.entries[prev as usize].next = next;
        }
        if next == NIL {
            list.tail = prev;
        } else {
            self.entries[next as usize].prev = prev;
        }
        let entry = &mut self.entries[index as usize];
        entry.prev = NIL;
        entry.next = NIL;
    }
}

/// The level of an entry due at `due_ms` when the wheel is at `elapsed_ms`:
/// the level of the highest bit in which the two differ.
fn level_for(elapsed_ms: u64, due_ms: u64) -> usize {
    debug_assert!(due_ms > elapsed_ms);
    let masked = (elapsed_ms ^ due_ms) | ((1 << SLOT_BITS) - 1);
    let significant = 63 - masked.leading_zeros() as usize;
    let level = significant / SLOT_BITS as usize;
    debug_assert!(level < NUM_LEVELS, "due={due_ms} elapsed={elapsed_ms}");
    level
}

fn clear_bit(bits: &mut [u64; WORDS], slot: usize) {
    bits[slot / 64] &= !(1 << (slot % 64));
}

/// The first set bit at or after `from`, wrapping around.
fn first_set_from(bits: &[u64; WORDS], from: usize) -> Option<usize> {
    let w0 = from / 64;
    let high = bits[w0] & (!0u64 << (from % 64));
    if high != 0 {
        return Some(w0 * 64 + high.trailing_zeros() as usize);
    }
    for i in 1..WORDS {
        let w = (w0 + i) % WORDS;
        if bits[w] != 0 {
            return Some(w * 64 + bits[w].trailing_zeros() as usize);
        }
    }
    let low = bits[w0] & !(!0u64 << (from % 64));
    (low != 0).then(|| w0 * 64 + low.trailing_zeros() as usize)
}

fn slot_for(due_ms: u64, level: usize) -> usize {
    ((due_ms >> (SLOT_BITS as usize * level)) % SLOTS_PER_LEVEL as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_for_matches_the_layout_table() {
        assert_eq!(level_for(0, 1), 0);
        assert_eq!(level_for(0, 255), 0);
        assert_eq!(level_for(0, 256), 1);
        assert_eq!(level_for(0, 65_535), 1);
        assert_eq!(level_for(0, 65_536), 2);
        assert_eq!(level_for(0, (1 << 40) - 1), 4);
        assert_eq!(level_for(0, 1 << 40), 5);
        assert_eq!(level_for(0, MAX_DUE_MS), 5);
        // Crossing a 256 ms boundary needs level 1 even for a 1 ms delay.
        assert_eq!(level_for(255, 256), 1);
    }

    #[test]
    fn first_set_from_wraps() {
        let mut bits = [0u64; WORDS];
        assert_eq!(first_set_from(&bits, 10), None);
        bits[0] |= 1 << 3;
        assert_eq!(first_set_from(&bits, 3), Some(3));
        assert_eq!(first_set_from(&bits, 4), Some(3));
        assert_eq!(first_set_from(&bits, 200), Some(3));
        bits[3] |= 1 << 63;
        assert_eq!(first_set_from(&bits, 4), Some(255));
        assert_eq!(first_set_from(&bits, 255), Some(255));
    }

    #[test]
    fn two_year_span_fits_below_the_top_level() {
        let two_years_ms = 2 * 365 * 24 * 3600 * 1000u64;
        assert!(two_years_ms < 1 << 40, "level 4 alone spans over two years");
        let now = 1_800_000_000_000u64;
        assert!(now + two_years_ms <= MAX_DUE_MS);
    }

    #[test]
    fn entry_is_small() {
        assert_eq!(Wheel::<()>::entry_size_bytes(), 24, "{}", Wheel::<()>::entry_size_bytes());
    }
}
