//! Runs the contract table (`contract_cases`) through the parser and the
//! validators: every row's status, `code` and `param` must match.

use super::contract_cases::{all_cases, Api, Case};
use crate::api::chat::ChatCompletionRequest;
use crate::api::responses::CreateResponseRequest;
use crate::error::ApiError;
use crate::parse::json_body;

fn run(case: &Case) -> Result<(), ApiError> {
    match case.api {
        Api::Chat => {
            let req: ChatCompletionRequest = json_body(&case.body)?;
            let headers = super::chat::ChatHeaders {
                session_id: case.session_id,
            };
            super::chat::validate(&crate::catalog::Catalog::default(), &req, &headers).map(|_| ())
        }
        Api::Responses => {
            let req: CreateResponseRequest = json_body(&case.body)?;
            super::responses::validate(&crate::catalog::Catalog::default(), &req).map(|_| ())
        }
    }
}

#[test]
fn every_rule_of_the_contract_table_holds() {
    let cases = all_cases();
    assert!(cases.len() >= 60, "only {} rows", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let got = match run(case) {
            Ok(()) => (200, None, None),
            Err(e) => (e.status, Some(e.code.to_string()), e.param.clone()),
        };
        let want = (
            case.status,
            case.code.map(str::to_owned),
            case.param.map(str::to_owned),
        );
        if got != want {
            failures.push(format!(
                "{:?} {}: got {got:?}, want {want:?}",
                case.api, case.name
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn row_names_are_unique() {
    let cases = all_cases();
    let mut names: Vec<_> = cases.iter().map(|c| (c.api as u8, c.name)).collect();
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "duplicate row names");
}
