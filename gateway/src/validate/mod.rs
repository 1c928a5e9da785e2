//! Validation of parsed requests: bounds, shapes, model capabilities.
//! Everything a client can get wrong is checked here, before any worker is
//! involved, and reported with a dot-path `param` and a stable `code`.
//! `common` holds the rules both generation APIs share.

pub mod chat;
pub mod common;
#[cfg(test)]
pub mod contract_cases;
pub mod messages;
pub mod responses;
mod satisfiable;

#[cfg(test)]
mod contract_tests;

#[cfg(test)]
mod fuzz_tests;

#[cfg(test)]
mod bench_tests;
