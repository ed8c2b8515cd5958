//! Memory per pending entry, measured with a counting allocator: the figure
//! quoted in the crate README.

use std::alloc::GlobalAlloc;
use std::alloc::Layout;
use std::alloc::System;
use std::sync::atomic::AtomicIsize;
use std::sync::atomic::Ordering;

use tocsin_wheel::Wheel;

struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// A test-only allocator wrapper: counting needs `unsafe impl GlobalAlloc`.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The budget: at most 64 bytes per pending entry, excluding the
/// caller's key. Measured with a unit key and 1M entries spread over a day,
/// counting allocated (not just used) capacity.
#[test]
fn bytes_per_pending_entry_within_budget() {
    const N: u64 = 1_000_000;
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut wheel: Wheel<()> = Wheel::new(0);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..N {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        wheel.insert(1 + x % 86_400_000, ()).unwrap();
    }
    let used = (LIVE_BYTES.load(Ordering::Relaxed) - before) as f64;
    let per_entry = used / N as f64;
    println!(
        "wheel memory: {per_entry:.1} bytes/entry allocated for {N} entries (slab entry {} bytes)",
        Wheel::<()>::entry_size_bytes()
    );
    assert!(per_entry <= 64.0, "{per_entry} bytes per entry");
    assert!(wheel.allocated_bytes() as f64 <= used + 1.0);
}
