//! Streams a chat answer from a model.
//!
//!     cargo run --example chat -- [MODEL.gguf] [QUESTION] [MAX_TOKENS]
//!
//! The model defaults to $LLMINFER_TEST_MODEL.

use llminfer::{
    ChatMessage, FinishReason, Model, RequestParams, Session, SessionParams, TokenizeFlags,
};
use std::io::Write;

fn main() {
    if let Err(err) = run() {
        eprintln!("chat: {}", err);
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = match args
        .next()
        .or_else(|| std::env::var("LLMINFER_TEST_MODEL").ok())
    {
        Some(path) => path,
        None => return Err("usage: chat MODEL.gguf [QUESTION] [MAX_TOKENS]".into()),
    };
    let question = args
        .next()
        .unwrap_or_else(|| "What is the capital of France?".to_string());
    let max_tokens: u32 = match args.next() {
        Some(n) => n.parse()?,
        None => 48,
    };

    let model = Model::load(&path)?;
    let messages = [
        ChatMessage::system("You are a helpful assistant. Answer briefly."),
        ChatMessage::user(question.as_str()),
    ];
    let prompt = model.apply_chat_template(&messages, true)?;
    let tokens = model.tokenize(
        &prompt,
        TokenizeFlags::ADD_SPECIAL | TokenizeFlags::PARSE_SPECIAL,
    )?;

    let params = SessionParams {
        n_ctx: 1024,
        ..SessionParams::default()
    };
    let mut session = Session::new(&model, &params)?;
    let request = RequestParams::greedy(max_tokens);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for event in session.stream(&tokens, &request)? {
        let event = event?;
        out.write_all(event.text.as_bytes())?;
        out.flush()?;
        if event.finish == Some(FinishReason::Length) {
            out.write_all("…".as_bytes())?;
        }
    }
    writeln!(out)?;
    Ok(())
}
