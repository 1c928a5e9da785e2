//! Bounds of the protocol's fields that both sides hold to: the gateway
//! refuses a client request over them (with bounds of its own, at most
//! these), and a worker refuses a Generate over them with INVALID_REQUEST,
//! whichever gateway sent it.

/// Most stop strings in one request (spec 2.4: up to 4).
pub const MAX_STOPS: usize = 4;

/// Longest stop string, in bytes: the gateway's 256 characters at 4 bytes
/// each.
pub const MAX_STOP_BYTES: usize = 1024;
