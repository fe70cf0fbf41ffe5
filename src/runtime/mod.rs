//! The running operator: leader election, caches, deficit queue, reconciler, finalizer, GC.
