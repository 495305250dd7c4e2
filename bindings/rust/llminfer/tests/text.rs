//! Tokenizer, detokenizer and chat template.

mod common;

use llminfer::{ChatMessage, DetokenizeFlags, Status, TokenizeFlags};

#[test]
fn tokenize_detokenize_round_trip() {
    let model = match common::model("round_trip") {
        Some(model) => model,
        None => return,
    };
    let text = "Hello, world! Ünïcödé text and emoji 🦀 survive the round trip.";
    let tokens = model.tokenize(text, TokenizeFlags::NONE).unwrap();
    assert!(!tokens.is_empty());
    assert_eq!(
        model.detokenize(&tokens, DetokenizeFlags::NONE).unwrap(),
        text
    );

    // The model's add_bos_token decides whether ADD_SPECIAL adds a BOS.
    let with_special = model.tokenize(text, TokenizeFlags::ADD_SPECIAL).unwrap();
    assert!(with_special.ends_with(&tokens));
}

#[test]
fn long_text_grows_the_buffers() {
    let model = match common::model("long_text") {
        Some(model) => model,
        None => return,
    };
    // Longer than the first guesses (256 bytes of text, len + 8 tokens).
    let text = "a b c d e f g h i j k l m n o p q r s t u v w x y z ".repeat(40);
    let tokens = model.tokenize(&text, TokenizeFlags::NONE).unwrap();
    let back = model.detokenize(&tokens, DetokenizeFlags::NONE).unwrap();
    assert_eq!(back, text);
    assert!(back.len() > 1000);
}

#[test]
fn special_tokens_are_parsed_and_rendered_on_request() {
    let model = match common::model("special_tokens") {
        Some(model) => model,
        None => return,
    };
    let parsed = model
        .tokenize("<|im_start|>user", TokenizeFlags::PARSE_SPECIAL)
        .unwrap();
    let plain = model
        .tokenize("<|im_start|>user", TokenizeFlags::NONE)
        .unwrap();
    assert!(parsed.len() < plain.len());
    assert_eq!(
        model.detokenize(&parsed, DetokenizeFlags::SPECIAL).unwrap(),
        "<|im_start|>user"
    );
    assert_eq!(
        model.detokenize(&parsed, DetokenizeFlags::NONE).unwrap(),
        "user"
    );
}

#[test]
fn strict_tokenizing_refuses_unknown_bytes() {
    let model = match common::model("strict") {
        Some(model) => model,
        None => return,
    };
    let err = model
        .tokenize("a\u{4}b", TokenizeFlags::STRICT)
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(!err.message.is_empty());
}

#[test]
fn streaming_detokenizer_gives_whole_characters() {
    let model = match common::model("detokenizer") {
        Some(model) => model,
        None => return,
    };
    let text = "Crabs 🦀 and naïve cafés.";
    let tokens = model.tokenize(text, TokenizeFlags::NONE).unwrap();
    let mut detok = model.detokenizer(DetokenizeFlags::NONE).unwrap();
    let mut out = String::new();
    for token in tokens {
        out.push_str(&detok.push(token).unwrap());
    }
    out.push_str(&detok.flush().unwrap());
    assert_eq!(out, text);
}

#[test]
fn chat_template_renders_chatml() {
    let model = match common::model("chat_template") {
        Some(model) => model,
        None => return,
    };
    assert!(model.info().unwrap().has_chat_template);
    let messages = [ChatMessage::system("Be brief."), ChatMessage::user("Hi")];
    let text = model.apply_chat_template(&messages, true).unwrap();
    assert!(
        text.contains("<|im_start|>system\nBe brief.<|im_end|>"),
        "{}",
        text
    );
    assert!(text.ends_with("<|im_start|>assistant\n"), "{}", text);
    let long = ChatMessage::user("x".repeat(2000));
    assert!(model.apply_chat_template(&[long], false).unwrap().len() > 2000);
    let err = model
        .apply_chat_template(&[ChatMessage::user("a\0b")], true)
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
}

#[test]
fn model_info_describes_the_model() {
    let model = match common::model("model_info") {
        Some(model) => model,
        None => return,
    };
    let info = model.info().unwrap();
    assert_eq!(info.architecture, "llama");
    assert!(info.n_vocab > 1000 && info.n_layers > 0 && info.n_params > 0);
    assert!(info.eos.is_some());
}
