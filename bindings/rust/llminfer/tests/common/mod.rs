//! Shared by the integration tests: the model from LLMINFER_TEST_MODEL.
#![allow(dead_code)]

use llminfer::{Model, Session, SessionParams, TokenizeFlags};

/// The test model, or None (with a message) when LLMINFER_TEST_MODEL is unset.
pub fn model(test: &str) -> Option<Model> {
    match std::env::var("LLMINFER_TEST_MODEL") {
        Ok(path) if !path.is_empty() => Some(Model::load(&path).expect("loading the test model")),
        _ => {
            skip(&format!("skipped {}: LLMINFER_TEST_MODEL is not set", test));
            None
        }
    }
}

/// A small session: short context, one thread (the tests run side by side).
pub fn session(model: &Model) -> Session {
    let params = SessionParams {
        n_ctx: 512,
        n_threads: 1,
        ..SessionParams::default()
    };
    Session::new(model, &params).expect("creating a session")
}

/// Tokenized as llm-run does it.
pub fn prompt(model: &Model, text: &str) -> Vec<llminfer::Token> {
    model
        .tokenize(
            text,
            TokenizeFlags::ADD_SPECIAL | TokenizeFlags::PARSE_SPECIAL,
        )
        .expect("tokenizing")
}

/// Says why a test did nothing. Written to stderr directly: the test
/// harness captures (and hides) eprintln! output of passing tests.
pub fn skip(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{}", message);
}
