//! Heap accounting for the benchmark: a counting wrapper around the system allocator. The
//! benchmark binary installs it (`#[global_allocator]`); the operator binary does not. With it,
//! a scenario can tell how much of the process heap the operator core holds, by dropping the
//! core last and counting what that frees, apart from the simulator and the in-memory API server
//! that share the process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting live and peak bytes.
pub struct CountingAllocator;

fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to `System`; only counters are added.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

/// Whether the counting allocator is the process's allocator (it has seen an allocation).
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// Bytes allocated and not freed.
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// The most bytes live at once since the last [`reset_peak`].
pub fn peak_bytes() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Start a new peak from the current live bytes.
pub fn reset_peak() {
    PEAK.store(live_bytes(), Ordering::Relaxed);
}

/// Bytes to MiB.
pub fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// How the heap left at the end of a scenario divides between its parts, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapShares {
    /// The operator core: node slots, EC2 cache, queue, gate, metrics.
    pub operator: usize,
    /// Extra heap while one full EC2 refresh runs on top of that (the response pages, the new
    /// view being merged). Includes the simulator's own copy of the answer, so it overstates.
    pub refresh_transient: usize,
    /// The in-memory API server standing in for Kubernetes.
    pub api_server: usize,
    /// The simulated EC2 account.
    pub simulator: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_allocator_installed_nothing_is_counted() {
        // Unit tests run on the system allocator: the counters stay at zero and say so.
        assert!(!installed());
        assert_eq!(live_bytes(), 0);
        reset_peak();
        assert_eq!(peak_bytes(), 0);
        assert_eq!(mib(3 * 1024 * 1024), 3.0);
    }
}
