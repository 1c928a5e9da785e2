//! `POST /v1/responses/compact`: one unstored, non-streamed generation over
//! the conversation (`previous_response_id`'s chain, then `input`) that asks
//! the model for a summary; the answer is the conversation's user messages
//! and one `compaction` item holding the summary, which a later
//! `POST /v1/responses` takes as input in place of what it replaces.

use super::responses::{conversation, response_object, Conversation};
use super::sinks::ResponseEvents;
use crate::accounts::Account;
use crate::api::responses::{
    CompactRequest, CompactedConversation, CreateResponseRequest, Input, InputItem, ItemContent,
    OutputItem, ResponseStatus,
};
use crate::app::App;
use crate::error::ApiError;
use crate::generation::{self, End};
use crate::http::Exchange;
use crate::ids::new_id;
use crate::limits::estimate_input_tokens;
use crate::translate::compaction;
use crate::translate::responses::{to_worker, ResponseEncoder};
use crate::{parse, validate};
use std::sync::Arc;

pub async fn compact(app: &App, ex: &mut Exchange, account: Arc<Account>) -> Result<(), ApiError> {
    let principal = account.principal.clone();
    // 1. Read and parse; the pass is validated as the response it runs as
    // (the parameters it shares with create keep their names).
    let body = ex
        .read_json_body(app.config.max_body_bytes, app.read_timeout())
        .await?;
    let req: CompactRequest = parse::json_body(&body)?;
    let input_estimate = estimate_input_tokens(body.len());
    drop(body);
    let pass = summary_pass(&req);
    let valid = validate::responses::validate(&app.catalog, &pass)?;
    ex.model = valid.model.id;
    account.check_model(valid.model.id)?;
    let sampling = generation::pool_of(&app.pools, valid.model.id)?.sampling_defaults();

    // 2. The conversation: the stored chain, then this input (bounded).
    let Conversation {
        context: conversation,
        tokens,
        ..
    } = conversation(app, &principal, &pass, &valid, None).await?;
    let input_estimate = input_estimate.max(tokens);
    let mut prompt = conversation.clone();
    prompt.push(user_message(compaction::ASK.to_owned()));

    // 3. Admit, translate, and run the pass to its end.
    let reservation = super::admit(
        app,
        ex,
        &account,
        valid.model,
        input_estimate,
        valid.max_output_tokens,
    )
    .await?;
    let mut work = to_worker(&pass, &valid, &prompt, &ex.request_id);
    generation::session_affinity(&mut work, ex.session_id());
    let (object, tier) = response_object(
        &account,
        &pass,
        &valid,
        ResponseStatus::InProgress,
        sampling,
    );
    let id = object.id.clone();
    let encoder = ResponseEncoder::new(object, valid.format.clone());
    let generation = super::generation(app, ex, valid.model.id, work, false, tier);
    let mut events = ResponseEvents::new(ex, encoder, false, app.shutdown.clone());
    let end = generation.run(reservation, &mut events).await;
    let ResponseEvents {
        reply,
        encoder,
        cut,
        ..
    } = events;
    match end {
        // A half summary is no summary: the drain's cut is an error.
        End::Gone if cut.happened() => {
            drop(reply);
            return Err(ApiError::replica_shutdown());
        }
        End::Gone => {
            reply.left();
            return Ok(());
        }
        End::NotStarted(e) | End::Failed(e) => return Err(e),
        End::Finished(_) => drop(reply),
    }
    if let Some(e) = encoder.failure() {
        return Err(e.clone());
    }

    // 4. The user's messages, then the summary in its compaction item.
    let summary = output_text(&encoder.object.output);
    let mut output: Vec<InputItem> = conversation
        .into_iter()
        .filter(|item| {
            item.kind.as_deref() == Some("message") && item.role.as_deref() == Some("user")
        })
        .collect();
    output.push(InputItem {
        kind: Some("compaction".into()),
        id: Some(new_id("cmp_")),
        encrypted_content: Some(crate::api::compaction::seal(&summary)),
        ..Default::default()
    });
    let compacted = CompactedConversation {
        id,
        object: "response.compaction",
        created_at: encoder.object.created_at,
        output,
        usage: encoder.object.usage.clone().unwrap_or_default(),
    };
    ex.send_json(200, &compacted, &[]).await;
    Ok(())
}

/// The response a compaction runs as: unstored, the client's instructions
/// (or the default ones), at most [`compaction::MAX_SUMMARY_TOKENS`].
fn summary_pass(req: &CompactRequest) -> CreateResponseRequest {
    let input = match (&req.input, &req.previous_response_id) {
        (Some(input), _) => Some(input.clone()),
        (None, Some(_)) => Some(Input::Items(Vec::new())),
        (None, None) => None,
    };
    CreateResponseRequest {
        model: req.model.clone(),
        input,
        instructions: Some(
            req.instructions
                .clone()
                .unwrap_or_else(|| compaction::DEFAULT_INSTRUCTIONS.to_owned()),
        ),
        previous_response_id: req.previous_response_id.clone(),
        store: Some(false),
        max_output_tokens: Some(compaction::MAX_SUMMARY_TOKENS),
        prompt_cache_key: req.prompt_cache_key.clone(),
        ..Default::default()
    }
}

fn user_message(text: String) -> InputItem {
    InputItem {
        kind: Some("message".into()),
        role: Some("user".into()),
        content: Some(ItemContent::Text(text)),
        ..Default::default()
    }
}

/// The text of a reply's messages.
fn output_text(output: &[OutputItem]) -> String {
    output
        .iter()
        .filter_map(|item| match item {
            OutputItem::Message { content, .. } => {
                Some(content.iter().map(|c| c.text.as_str()).collect::<String>())
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pass_is_unstored_bounded_and_keeps_the_client_s_instructions() {
        let req: CompactRequest = serde_json::from_str(
            r#"{"model":"base","input":"hi","instructions":"Be brief.","prompt_cache_key":"k"}"#,
        )
        .unwrap();
        let pass = summary_pass(&req);
        assert_eq!(pass.store, Some(false));
        assert_eq!(pass.max_output_tokens, Some(compaction::MAX_SUMMARY_TOKENS));
        assert_eq!(pass.instructions.as_deref(), Some("Be brief."));
        assert_eq!(pass.prompt_cache_key.as_deref(), Some("k"));
        let default: CompactRequest =
            serde_json::from_str(r#"{"model":"base","previous_response_id":"resp_1"}"#).unwrap();
        let pass = summary_pass(&default);
        assert_eq!(
            pass.instructions.as_deref(),
            Some(compaction::DEFAULT_INSTRUCTIONS)
        );
        assert!(matches!(pass.input, Some(Input::Items(ref items)) if items.is_empty()));
        let nothing: CompactRequest = serde_json::from_str(r#"{"model":"base"}"#).unwrap();
        assert!(
            summary_pass(&nothing).input.is_none(),
            "validation says input is missing"
        );
    }
}
