//! `POST /v1/responses/compact`: one unstored, non-streamed generation over
//! the conversation (`previous_response_id`'s chain, then `input`) that asks
//! the model for a summary; the answer is the conversation's user messages
//! and one `compaction` item holding the summary, which a later
//! `POST /v1/responses` takes as input in place of what it replaces. The
//! pass runs the Responses path (`crate::responses`) as the response it is.

use super::sinks::ResponseEvents;
use super::steps;
use crate::accounts::Account;
use crate::api::responses::{
    CompactRequest, CompactedConversation, CreateResponseRequest, Input, InputItem, ItemContent,
    OutputItem,
};
use crate::app::App;
use crate::error::ApiError;
use crate::http::Exchange;
use crate::ids::new_id;
use crate::limits::estimate_input_tokens;
use crate::parse;
use crate::responses::{self, Ended, NoKey, Request, Started};
use crate::translate::compaction;
use std::sync::Arc;

pub async fn compact(app: &App, ex: &mut Exchange, account: Arc<Account>) -> Result<(), ApiError> {
    let svc = app.responses();
    // 1. Read and parse; the pass is checked as the response it runs as
    // (the parameters it shares with create keep their names).
    let body = ex
        .read_json_body(app.config.max_body_bytes, app.read_timeout())
        .await?;
    let req: CompactRequest = parse::json_body(&body)?;
    let input_estimate = estimate_input_tokens(body.len());
    drop(body);
    let pass = summary_pass(&req);
    let checked = responses::check_request(&svc, &account, pass, input_estimate, &mut ex.model)?;

    // 2. The conversation: the stored chain, then this input (bounded).
    let mut prepared = responses::prepare(&svc, &account.principal, checked, None).await?;
    // The model is given the conversation, then the ask.
    prepared
        .context
        .push(user_message(compaction::ASK.to_owned()));

    // 3. Admit, translate, and run the pass to its end.
    let max_output = prepared.valid.max_output_tokens;
    let admitted = responses::admit(&svc, &account, &prepared, &ex.request_id, max_output).await;
    let reservation = steps::admitted(ex, admitted)?;
    let request = Request {
        request_id: &ex.request_id,
        session: ex.session_id(),
        trace: ex.trace,
        timed_from: None,
    };
    let Started {
        encoder,
        mut context,
        run,
    } = responses::start(&svc, &account, prepared, reservation, request).await?;
    context.pop();
    let mut events = ResponseEvents::new(ex, encoder, false, app.shutdown.clone());
    let ended = run.drive(&svc, &mut events, &mut NoKey).await;
    let ResponseEvents { reply, encoder, .. } = events;
    match ended {
        // A half summary is no summary: the drain's cut is an error.
        Ended::Cut => {
            drop(reply);
            return Err(ApiError::replica_shutdown());
        }
        Ended::Gone => {
            reply.left();
            return Ok(());
        }
        Ended::NotStarted(e) | Ended::Failed(e) => return Err(e),
        Ended::Finished => drop(reply),
    }
    if let Some(e) = encoder.failure() {
        return Err(e.clone());
    }

    // 4. The user's messages, then the summary in its compaction item.
    let summary = output_text(&encoder.object.output);
    let mut output: Vec<InputItem> = context
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
        id: encoder.object.id.clone(),
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
