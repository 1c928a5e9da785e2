//! The JSON shapes of both versions, as lenient serde types.

use super::{AgentFailure, Part as OutPart};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Serialize)]
pub struct RpcRequest<'a> {
    pub jsonrpc: &'static str,
    pub id: String,
    pub method: &'a str,
    pub params: Value,
}

#[derive(Deserialize)]
pub struct RpcReply {
    #[serde(default)]
    pub result: Option<Value>,
    #[serde(default)]
    pub error: Option<RpcError>,
}

#[derive(Deserialize)]
pub struct RpcError {
    #[serde(default)]
    pub code: i64,
    #[serde(default)]
    pub message: String,
}

impl RpcReply {
    pub fn into_result(self) -> Result<Value, AgentFailure> {
        match (self.result, self.error) {
            (_, Some(e)) => Err(AgentFailure::RpcError(e.code, e.message)),
            (Some(r), None) => Ok(r),
            (None, None) => Err(AgentFailure::Malformed(
                "a JSON-RPC reply without result or error".into(),
            )),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Card {
    pub name: String,
    pub description: Option<String>,
    pub supported_interfaces: Vec<Interface>,
    pub additional_interfaces: Vec<Interface>,
    pub url: Option<String>,
    pub protocol_version: Option<String>,
    pub preferred_transport: Option<String>,
    pub capabilities: Option<Capabilities>,
    pub skills: Vec<CardSkill>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Interface {
    pub url: String,
    pub protocol_binding: Option<String>,
    /// v0.3's name for the binding.
    pub transport: Option<String>,
    pub protocol_version: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Capabilities {
    pub streaming: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct CardSkill {
    pub name: Option<String>,
    pub description: Option<String>,
    pub tags: Vec<String>,
}

/// A result: v1.0's one-key wrappers, or v0.3's `kind`-tagged object
/// (whose fields are then read from `rest`).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct RpcResult {
    pub task: Option<Task>,
    pub message: Option<Message>,
    pub status_update: Option<StatusUpdate>,
    pub artifact_update: Option<ArtifactUpdate>,
    pub kind: Option<String>,
    #[serde(flatten)]
    pub rest: serde_json::Map<String, Value>,
}

impl RpcResult {
    fn rest<T: for<'de> Deserialize<'de> + Default>(&self) -> T {
        serde_json::from_value(Value::Object(self.rest.clone())).unwrap_or_default()
    }
    pub fn flat_task(&self) -> Task {
        self.rest()
    }
    pub fn flat_message(&self) -> Message {
        self.rest()
    }
    pub fn flat_status_update(&self) -> StatusUpdate {
        self.rest()
    }
    pub fn flat_artifact_update(&self) -> ArtifactUpdate {
        self.rest()
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Task {
    pub id: Option<String>,
    pub context_id: Option<String>,
    pub status: Option<Status>,
    pub artifacts: Vec<Artifact>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Status {
    pub state: Option<String>,
    pub message: Option<Message>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Message {
    pub context_id: Option<String>,
    pub parts: Vec<Part>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Artifact {
    pub parts: Vec<Part>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct StatusUpdate {
    pub task_id: Option<String>,
    pub context_id: Option<String>,
    pub status: Option<Status>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ArtifactUpdate {
    pub task_id: Option<String>,
    pub artifact: Option<Artifact>,
}

/// A part of either version: v1.0 `{text}` / `{data, mediaType}` /
/// `{url|raw, filename, mediaType}`; v0.3 `{kind, text|data|file}`.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Part {
    pub text: Option<String>,
    pub data: Option<Value>,
    pub url: Option<String>,
    pub raw: Option<String>,
    pub filename: Option<String>,
    pub media_type: Option<String>,
    pub file: Option<File>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct File {
    pub uri: Option<String>,
    pub bytes: Option<String>,
    pub name: Option<String>,
    pub mime_type: Option<String>,
}

/// Largest inline file content kept (base64 characters).
const MAX_RAW: usize = 64 * 1024;

impl Part {
    pub fn into_part(self) -> Option<OutPart> {
        if let Some(text) = self.text {
            return Some(OutPart::Text { text });
        }
        if let Some(data) = self.data {
            return Some(OutPart::Data {
                data,
                media_type: self.media_type,
            });
        }
        if let Some(f) = self.file {
            return Some(OutPart::File {
                url: f.uri,
                raw: f.bytes.filter(|b| b.len() <= MAX_RAW),
                filename: f.name,
                media_type: f.mime_type,
            });
        }
        if self.url.is_some() || self.raw.is_some() {
            return Some(OutPart::File {
                url: self.url,
                raw: self.raw.filter(|b| b.len() <= MAX_RAW),
                filename: self.filename,
                media_type: self.media_type,
            });
        }
        None
    }
}
