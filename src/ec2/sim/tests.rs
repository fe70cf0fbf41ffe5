//! The simulator's own mechanics: throttling, latency, faults, detach delay, termination.
