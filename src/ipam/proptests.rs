//! Property tests of the engine (filled below).
