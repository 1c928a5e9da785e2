//! The models this service offers: the one table shared with the workers
//! (`inference_proto::models`), re-exported under the gateway's name.

pub use inference_proto::models::{find, ModelSpec, Price, MODELS};
