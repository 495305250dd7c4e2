//! Load errors, status names, closing and use after close.

mod common;

use llminfer::{Error, Model, RequestParams, Session, SessionParams, Status};

#[test]
fn missing_file_is_an_io_error_with_name_and_message() {
    let err = Model::load("/nonexistent/dir/model.gguf").unwrap_err();
    assert_eq!(err.status, Status::Io);
    assert_eq!(err.status_name, "LLM_ERR_IO");
    assert!(
        err.message.contains("model.gguf"),
        "message: {:?}",
        err.message
    );
    assert!(err.to_string().starts_with("LLM_ERR_IO: "), "{}", err);
}

#[test]
fn garbage_file_is_a_format_error() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("garbage.gguf");
    std::fs::write(
        &path,
        b"this is not a GGUF file, only some text to be refused",
    )
    .unwrap();
    let err = Model::load(&path).unwrap_err();
    std::fs::remove_file(&path).ok();
    assert_eq!(err.status, Status::BadFormat, "{}", err);
    assert_eq!(err.status_name, "LLM_ERR_BAD_FORMAT");
    assert!(!err.message.is_empty());
    let boxed: Box<dyn std::error::Error> = Box::new(err);
    assert!(boxed.to_string().contains("LLM_ERR_BAD_FORMAT"));
}

#[test]
fn a_path_with_a_nul_is_refused_before_the_library() {
    let err = Model::load("bad\0path").unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
}

#[test]
fn status_codes_round_trip_with_their_names() {
    for code in 1..=12 {
        let status = Status::from_code(code);
        assert_eq!(status.code(), code);
        assert!(status.name().starts_with("LLM_ERR_"), "{}", status.name());
        assert!(!status.description().is_empty());
    }
    assert_eq!(Status::from_code(99), Status::Other(99));
    let err = Error::new(Status::Limit, "");
    assert_eq!(err.to_string(), "LLM_ERR_LIMIT: limit exceeded");
}

#[test]
fn version_is_reported() {
    assert!(llminfer::version_number() >= 10200);
    assert!(llminfer::version().starts_with("1."));
    llminfer::check_library().unwrap();
}

#[test]
fn invalid_session_params_give_the_message_of_create() {
    let model = match common::model("invalid_session_params") {
        Some(model) => model,
        None => return,
    };
    let params = SessionParams {
        kv_cache_bytes: 1 << 60,
        ..SessionParams::default()
    };
    let err = Session::new(&model, &params).unwrap_err();
    assert!(
        matches!(err.status, Status::Limit | Status::OutOfMemory),
        "{}",
        err
    );
    assert!(err.message.contains("KV"), "{}", err.message);
}

#[test]
fn close_twice_and_use_after_close() {
    let model = match common::model("close_twice") {
        Some(model) => model,
        None => return,
    };
    let mut session = common::session(&model);
    let handle = session.handle();
    session.close();
    session.close();
    assert!(session.is_closed() && handle.is_closed());
    let tokens = common::prompt(&model, "Hello");
    let err = session
        .submit(&tokens, &RequestParams::default())
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("closed"));
    assert!(session.step().is_err());
    assert!(session.generate(&tokens, &Default::default()).is_err());
    assert!(session.stats().is_err());
    assert!(handle.submit(&tokens, &RequestParams::default()).is_err());
    assert!(handle.cancel(1).is_err());
    handle.interrupt();
    session.interrupt();
    drop(session);
    assert!(handle.is_closed());
}

#[test]
fn session_errors_carry_the_message() {
    let model = match common::model("session_errors") {
        Some(model) => model,
        None => return,
    };
    let session = common::session(&model);
    let err = session.cancel(12345).unwrap_err();
    assert_eq!(err.status, Status::NotFound);
    let long: Vec<i32> = vec![1; 600];
    let err = session
        .submit(&long, &RequestParams::default())
        .unwrap_err();
    assert_eq!(err.status, Status::Limit);
    assert!(!err.message.is_empty());
    let recorded = session.last_error().expect("a recorded failure");
    assert_eq!(recorded.status, Status::Limit);
    assert_eq!(recorded.message, err.message);
    let bad = RequestParams {
        sampling: Some(llminfer::SamplingParams {
            top_p: 2.0,
            ..Default::default()
        }),
        ..RequestParams::default()
    };
    let err = session.submit(&[1, 2, 3], &bad).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("top_p"), "{}", err.message);
}

#[test]
fn a_model_outlives_its_handle_through_sessions() {
    let model = match common::model("model_lifetime") {
        Some(model) => model,
        None => return,
    };
    let mut session = common::session(&model);
    let tokens = common::prompt(&model, "One, two,");
    drop(model);
    let generation = session
        .generate(&tokens, &llminfer::GenerateParams::greedy(4))
        .unwrap();
    assert_eq!(generation.tokens.len(), 4);
}
