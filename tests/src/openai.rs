//! The Rust `async-openai` crate pointed at a stack: the typed client a
//! Rust application would use, and the API error it parses.

use crate::Stack;
use async_openai::config::OpenAIConfig;
use async_openai::error::{ApiError, OpenAIError};
use async_openai::Client;

/// An `async-openai` client of the stack's gateway with its first key.
pub fn client(stack: &Stack) -> Client<OpenAIConfig> {
    client_with_key(stack, stack.gateway.api_key())
}

/// An `async-openai` client of the stack's gateway with `key`.
pub fn client_with_key(stack: &Stack, key: &str) -> Client<OpenAIConfig> {
    Client::with_config(
        OpenAIConfig::new()
            .with_api_base(stack.gateway.base_url())
            .with_api_key(key),
    )
}

/// The HTTP status and error body of an API error, or a panic naming what
/// came instead.
#[track_caller]
pub fn api_error<T: std::fmt::Debug>(result: Result<T, OpenAIError>) -> (u16, ApiError) {
    match result {
        Err(OpenAIError::ApiError(e)) => (e.status_code.as_u16(), e.api_error),
        other => panic!("expected an API error, got {other:?}"),
    }
}
