//! Validation of parsed requests: bounds, shapes, model capabilities.
//! Everything a client can get wrong is checked here, before any worker is
//! involved, and reported with a dot-path `param` and a stable `code`.

pub mod chat;
