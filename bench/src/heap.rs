//! Heap accounting for the benchmark. The counters come from a counting global allocator that
//! only the benchmark binary installs (the operator's library has no unsafe code); the binary
//! hands them to the scenarios as a [`HeapMeter`]. With it, a scenario can tell how much of the
//! process heap the operator core holds, by dropping the core last and counting what that
//! frees, apart from the simulator and the in-memory API server that share the process.

/// The process's heap counters, read through the benchmark binary's global allocator.
#[derive(Clone, Copy, Debug)]
pub struct HeapMeter {
    /// Bytes allocated and not freed.
    pub live_bytes: fn() -> usize,
    /// The most bytes live at once since the last `reset_peak`.
    pub peak_bytes: fn() -> usize,
    /// Start a new peak from the current live bytes.
    pub reset_peak: fn(),
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
    fn mib_divides_by_two_to_the_twenty() {
        assert_eq!(mib(3 * 1024 * 1024), 3.0);
        assert_eq!(mib(512 * 1024), 0.5);
    }
}
