//! The listeners on Pingora: the public one (`public.rs`: reads a request
//! under limits, hands it to `routes`, records metrics) and the admin one
//! (`admin.rs`).

pub mod admin;
pub mod public;
