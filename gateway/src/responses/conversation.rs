//! The conversation a Responses request continues: the stored chain of
//! `previous_response_id` (or a WebSocket connection's latest response),
//! then this request's input, with `item_reference`s replaced by the items
//! they name. One bounded resolution serves `POST /v1/responses`, WebSocket
//! turns and compaction.
//!
//! A reference copies an item, so a small body can name a large item many
//! times (150 references to one 1 MiB message asked the gateway for 150 MiB
//! and the worker refused the result with a 502). The resolved input is
//! therefore bounded as it is built, before each copy: the text the model
//! would read (the chain's, the instructions' and the resolved input's)
//! must fit the model's window as the early context check counts it, and
//! the items references add may hold no more bytes than a request body
//! may. Past either bound the request is a 400 `context_length_exceeded`
//! (param `input`).

use super::Services;
use crate::api::responses::{ContentPart, CreateResponseRequest, InputItem, ItemContent};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::ids::new_id;
use crate::limits::estimate_input_tokens;
use crate::translate::responses::output_as_input;
use crate::validate::common::check_context_window;
use crate::validate::responses::{item_text_bytes, ValidResponseRequest};

/// A request's conversation, resolved and within its bounds.
pub(super) struct Conversation {
    /// What the model is given: the chain's items, then this input.
    pub context: Vec<InputItem>,
    /// This request's items as stored and listed (references resolved).
    pub input_items: Vec<InputItem>,
    /// Input tokens to reserve for this input once resolved (the body's
    /// size undercounts an input made mostly of references).
    pub tokens: u64,
}

/// The conversation a request continues, with its own input appended.
/// `known` is the continued response's conversation when the caller holds
/// it (a WebSocket's connection-local state); otherwise
/// `previous_response_id` is read from the store.
pub(super) async fn conversation(
    svc: &Services<'_>,
    principal: &Principal,
    req: &CreateResponseRequest,
    valid: &ValidResponseRequest,
    known: Option<Vec<InputItem>>,
) -> Result<Conversation, ApiError> {
    let mut context = match (known, &req.previous_response_id) {
        (Some(known), _) => known,
        (None, Some(prev)) => previous_conversation(svc, principal, prev).await?,
        (None, None) => Vec::new(),
    };
    let before = context.iter().map(item_text_bytes).sum::<usize>()
        + req.instructions.as_deref().map_or(0, str::len);
    let bounds = Bounds {
        valid,
        text: before,
        referenced: 0,
        max_referenced: svc.max_body_bytes,
    };
    let (input_items, bounds) = resolve_items(&valid.items, &context, bounds)?;
    context.extend(input_items.iter().cloned());
    Ok(Conversation {
        context,
        input_items,
        tokens: estimate_input_tokens(bounds.text - before),
    })
}

/// What the resolved input may hold, and what it holds so far.
struct Bounds<'a> {
    valid: &'a ValidResponseRequest,
    /// Text bytes the model would read (chain, instructions, input so far).
    text: usize,
    /// Encoded bytes of the items references copied so far.
    referenced: usize,
    max_referenced: usize,
}

impl Bounds<'_> {
    /// Counts `item` in, refusing it when the input then cannot fit.
    fn take(&mut self, item: &InputItem, reference: bool) -> Result<(), ApiError> {
        self.text += item_text_bytes(item);
        let max_output = self.valid.max_output_tokens;
        check_context_window(
            self.valid.model,
            self.text,
            (max_output > 0).then_some(max_output),
            "input",
            "max_output_tokens",
        )?;
        if reference {
            self.referenced += crate::api::encoded_len(item);
            if self.referenced > self.max_referenced {
                return Err(ApiError::new(
                    400,
                    "context_length_exceeded",
                    format!(
                        "The items 'input' references hold more than {} bytes, more than a request body may; send fewer references.",
                        self.max_referenced
                    ),
                )
                .with_param("input"));
            }
        }
        Ok(())
    }
}

/// The conversation a `previous_response_id` continues: its context and
/// its output. Missing, expired or another org's → 404; unfinished → 409.
async fn previous_conversation(
    svc: &Services<'_>,
    principal: &Principal,
    prev: &str,
) -> Result<Vec<InputItem>, ApiError> {
    let conv = svc
        .runs
        .store
        .conversation(&principal.org, prev)
        .await?
        .ok_or_else(|| {
            ApiError::new(
                404,
                "previous_response_not_found",
                format!("Previous response with id '{prev}' not found."),
            )
            .with_param("previous_response_id")
        })?;
    if !conv.object.is_terminal() {
        return Err(ApiError::new(
            409,
            "previous_response_not_finished",
            format!(
                "Previous response '{prev}' is still {}; retry once it has finished.",
                conv.object.status
            ),
        )
        .with_param("previous_response_id"));
    }
    let mut items = conv.context;
    items.extend(conv.object.output.iter().map(output_as_input));
    Ok(items)
}

/// This request's items as stored and listed: typed, with ids, string
/// content as parts, and item references replaced by the items they name
/// (looked up in the conversation being continued), each counted against
/// `bounds` before it is copied.
fn resolve_items<'a>(
    items: &[InputItem],
    context: &[InputItem],
    mut bounds: Bounds<'a>,
) -> Result<(Vec<InputItem>, Bounds<'a>), ApiError> {
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let kind = item.kind.as_deref().unwrap_or("message");
        if kind == "item_reference" {
            let wanted = item.id.as_deref().unwrap_or_default();
            let found = context
                .iter()
                .chain(out.iter())
                .find(|c: &&InputItem| c.id.as_deref() == Some(wanted))
                .ok_or_else(|| {
                    ApiError::invalid_value(
                        format!("input.{i}.id"),
                        format!(
                            "Item '{wanted}' was not found in the conversation being continued."
                        ),
                    )
                })?;
            bounds.take(found, true)?;
            let found = found.clone();
            out.push(found);
            continue;
        }
        let mut item = item.clone();
        item.kind = Some(kind.to_owned());
        match kind {
            "message" => {
                if item.id.is_none() {
                    item.id = Some(new_id("msg_"));
                }
                if let Some(ItemContent::Text(t)) = &item.content {
                    let part = if item.role.as_deref() == Some("assistant") {
                        ContentPart::OutputText {
                            text: t.clone(),
                            annotations: Vec::new(),
                        }
                    } else {
                        ContentPart::InputText { text: t.clone() }
                    };
                    item.content = Some(ItemContent::Parts(vec![part]));
                }
                item.status.get_or_insert_with(|| "completed".into());
            }
            "function_call" => {
                item.id.get_or_insert_with(|| new_id("fc_"));
                item.status.get_or_insert_with(|| "completed".into());
            }
            "function_call_output" => {
                item.id.get_or_insert_with(|| new_id("fco_"));
                item.status.get_or_insert_with(|| "completed".into());
            }
            "compaction" => {
                item.id.get_or_insert_with(|| new_id("cmp_"));
            }
            _ => {
                item.id.get_or_insert_with(|| new_id("rs_"));
            }
        }
        bounds.take(&item, false)?;
        out.push(item);
    }
    Ok((out, bounds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;

    fn validated(catalog: &Catalog, items: Vec<InputItem>) -> ValidResponseRequest {
        let req = CreateResponseRequest {
            model: Some("base".into()),
            input: Some(crate::api::responses::Input::Items(items)),
            ..Default::default()
        };
        crate::validate::responses::validate(catalog, &req).unwrap()
    }

    fn bounds(valid: &ValidResponseRequest, max_referenced: usize) -> Bounds<'_> {
        Bounds {
            valid,
            text: 0,
            referenced: 0,
            max_referenced,
        }
    }

    fn message(text: String) -> InputItem {
        InputItem {
            role: Some("user".into()),
            content: Some(ItemContent::Text(text)),
            ..Default::default()
        }
    }

    fn reference(id: &str) -> InputItem {
        InputItem {
            kind: Some("item_reference".into()),
            id: Some(id.into()),
            ..Default::default()
        }
    }

    #[test]
    fn items_get_ids_and_references_resolve() {
        let catalog = Catalog::default();
        let ctx = vec![InputItem {
            kind: Some("message".into()),
            id: Some("msg_old".into()),
            role: Some("user".into()),
            content: Some(ItemContent::Text("earlier".into())),
            ..Default::default()
        }];
        let items = vec![message("hi".into()), reference("msg_old")];
        let valid = validated(&catalog, items.clone());
        let (out, used) = resolve_items(&items, &ctx, bounds(&valid, 1 << 20)).unwrap();
        assert!(out[0].id.as_deref().unwrap().starts_with("msg_"));
        assert!(matches!(out[0].content, Some(ItemContent::Parts(_))));
        assert_eq!(out[1].id.as_deref(), Some("msg_old"));
        assert_eq!(used.text, "hi".len() + "earlier".len());
        let missing = vec![reference("nope")];
        let Err(e) = resolve_items(&missing, &[], bounds(&valid, 1 << 20)) else {
            panic!("a missing item resolves");
        };
        assert_eq!(e.param.as_deref(), Some("input.0.id"));
    }

    /// Issue 52, item 2: one large message referenced many times is
    /// refused at the reference that takes the text past the window,
    /// before it is copied, not built whole (150 × 1 MiB).
    #[test]
    fn references_past_the_window_are_refused_before_they_are_copied() {
        let catalog = Catalog::default();
        let mut items = vec![InputItem {
            id: Some("msg_big".into()),
            ..message("x".repeat(1 << 20))
        }];
        items.extend((0..150).map(|_| reference("msg_big")));
        let valid = validated(&catalog, items.clone());
        let Err(e) = resolve_items(&items, &[], bounds(&valid, 16 << 20)) else {
            panic!("150 MiB of input fits no window");
        };
        assert_eq!(
            (e.status, e.code.as_ref(), e.param.as_deref()),
            (400, "context_length_exceeded", Some("input"))
        );
        // A chain whose text already fills the window counts too.
        let small = vec![message("hi".into())];
        let valid = validated(&catalog, small.clone());
        let mut full = bounds(&valid, 16 << 20);
        full.text = 200_000 * 8;
        assert!(resolve_items(&small, &[], full).is_err());
    }

    /// Bytes the model never reads (a reasoning item's `encrypted_content`)
    /// are bounded too: references may copy no more than a body holds.
    #[test]
    fn references_copy_no_more_than_a_body_holds() {
        let catalog = Catalog::default();
        let mut items = vec![
            message("hi".into()),
            InputItem {
                kind: Some("reasoning".into()),
                id: Some("rs_1".into()),
                encrypted_content: Some("e".repeat(100_000)),
                ..Default::default()
            },
        ];
        items.extend((0..10).map(|_| reference("rs_1")));
        let valid = validated(&catalog, items.clone());
        let (out, _) = resolve_items(&items, &[], bounds(&valid, 1 << 20)).unwrap();
        assert_eq!(out.len(), 12);
        let Err(e) = resolve_items(&items, &[], bounds(&valid, 500_000)) else {
            panic!("a million bytes of references fit half a million");
        };
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            ("context_length_exceeded", Some("input"))
        );
    }
}
