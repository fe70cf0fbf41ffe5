//! Gate.
