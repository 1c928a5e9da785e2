//! Validation CPU per request (issue 3 asks for at most 10 µs on a typical
//! request). Run with
//! `cargo test --release -p gateway --lib validation_cost -- --ignored --nocapture`.

use crate::api::chat::ChatCompletionRequest;
use crate::parse::json_body;
use std::hint::black_box;
use std::time::Instant;

const TYPICAL: &str = r#"{"model":"base","messages":[
 {"role":"system","content":"You are a helpful assistant. Answer briefly and cite sources when you can."},
 {"role":"user","content":"What is the capital of France, and what is it famous for? Give me three short points."}
],"temperature":0.7,"max_tokens":256,"stream":true,"stream_options":{"include_usage":true}}"#;

fn with_tools_and_schema() -> String {
    let tool = |name: &str| {
        format!(
            r#"{{"type":"function","function":{{"name":"{name}","description":"Looks something up.","strict":true,
            "parameters":{{"type":"object","properties":{{"city":{{"type":"string","description":"City name"}},
            "unit":{{"type":"string","enum":["celsius","fahrenheit"]}},"days":{{"type":"integer","minimum":1,"maximum":14}}}},
            "required":["city","unit","days"],"additionalProperties":false}}}}}}"#
        )
    };
    format!(
        r#"{{"model":"base","messages":[
 {{"role":"system","content":"You are a helpful assistant."}},
 {{"role":"user","content":"Plan my week in Paris and Lyon with the weather."}}
],"tools":[{},{},{}],"tool_choice":"auto",
"response_format":{{"type":"json_schema","json_schema":{{"name":"plan","strict":true,"schema":{{"type":"object",
"properties":{{"days":{{"type":"array","items":{{"type":"object","properties":{{"city":{{"type":"string"}},"activity":{{"type":"string"}}}},
"required":["city","activity"],"additionalProperties":false}}}},"summary":{{"type":"string"}}}},
"required":["days","summary"],"additionalProperties":false}}}}}}}}"#,
        tool("get_weather"),
        tool("get_forecast"),
        tool("get_events")
    )
}

fn measure(label: &str, body: &[u8], iterations: u32) -> f64 {
    let headers = super::chat::ChatHeaders::default();
    let catalog = crate::catalog::Catalog::default();
    // Warm up (lazy statics: meta-schemas, regexes).
    for _ in 0..1000 {
        let req: ChatCompletionRequest = json_body(body).unwrap();
        super::chat::validate(&catalog, &req, &headers).unwrap();
    }
    let start = Instant::now();
    for _ in 0..iterations {
        let req: ChatCompletionRequest = json_body(black_box(body)).unwrap();
        black_box(&req);
    }
    let parse = start.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
    let req: ChatCompletionRequest = json_body(body).unwrap();
    let start = Instant::now();
    for _ in 0..iterations {
        black_box(super::chat::validate(&catalog, black_box(&req), &headers).unwrap());
    }
    let validate = start.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
    println!(
        "{label}: parse {parse:.2} µs + validate {validate:.2} µs = {:.2} µs per request ({} bytes)",
        parse + validate,
        body.len()
    );
    parse + validate
}

#[test]
#[ignore = "benchmark: run explicitly with --ignored --nocapture"]
fn validation_cost() {
    let typical = measure("typical chat request", TYPICAL.as_bytes(), 100_000);
    let heavy = with_tools_and_schema();
    measure(
        "3 strict tools + strict json_schema",
        heavy.as_bytes(),
        20_000,
    );
    assert!(typical < 10.0, "typical request costs {typical:.2} µs");
}
