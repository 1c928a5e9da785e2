//! The HTTP edge on Pingora: one `Exchange` per request, the public app and
//! its router, and the admin listener.

pub mod admin;
pub mod app;
pub mod exchange;
