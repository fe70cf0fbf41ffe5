//! SDK-backed client.
