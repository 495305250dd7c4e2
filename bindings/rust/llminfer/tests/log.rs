//! The log sink: messages arrive, a panicking sink is contained, clearing works.

mod common;

use llminfer::{clear_log_sink, set_log_sink, LogLevel};
use std::sync::{Arc, Mutex};

#[test]
fn library_messages_reach_the_sink() {
    let seen: Arc<Mutex<Vec<(LogLevel, String)>>> = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    set_log_sink(LogLevel::Debug, move |level, message| {
        sink.lock().unwrap().push((level, message.to_string()));
    });
    let _ = llminfer::Model::load("/nonexistent/model.gguf");
    if let Some(model) = common::model("log sink") {
        drop(model);
    }
    // A panicking sink loses its messages, and nothing unwinds into C.
    set_log_sink(LogLevel::Debug, |_, _| {
        panic!("deliberate panic in a log sink (caught)")
    });
    let _ = llminfer::Model::load("/nonexistent/model.gguf");
    clear_log_sink();
    clear_log_sink();
    let count = seen.lock().unwrap().len();
    let _ = llminfer::Model::load("/nonexistent/model.gguf");
    assert_eq!(
        seen.lock().unwrap().len(),
        count,
        "a cleared sink gets nothing"
    );
    if std::env::var("LLMINFER_TEST_MODEL").is_ok() {
        assert!(count > 0, "loading a model logs something");
    }
}
