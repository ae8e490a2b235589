//! The samplers' integration tests, one binary. `allocation_free` installs a counting global
//! allocator for the whole binary; it counts only on threads that ask, so the other tests are unaffected.

mod acceptance;
mod allocation_free;
mod alpha_star;
mod common;
mod lossless_exact;
mod lossless_statistical;
mod peaked;
mod positional;
