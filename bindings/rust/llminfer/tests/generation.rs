//! Generation: the same answer as the C library's CLI, streaming, several
//! requests, sampling, cancelling and interrupting.

mod common;

use llminfer::{
    Event, FinishReason, GenerateParams, Model, RequestParams, SamplingParams, Session, Status,
};
use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// What `llm-run` prints as its greedy continuation of `prompt`.
fn llm_run_greedy(prompt: &str, n: u32, chat: bool) -> Option<String> {
    let run = match std::env::var("LLMINFER_RUN") {
        Ok(run) if !run.is_empty() => run,
        _ => {
            common::skip("skipped the llm-run comparison: LLMINFER_RUN is not set");
            return None;
        }
    };
    let model = std::env::var("LLMINFER_TEST_MODEL").unwrap();
    let mut command = Command::new(run);
    command.args([
        "-m",
        &model,
        "-p",
        prompt,
        "-n",
        &n.to_string(),
        "--temp",
        "0",
        "-t",
        "1",
    ]);
    if chat {
        command.arg("--chat");
    }
    let output = command.output().expect("running llm-run");
    assert!(
        output.status.success(),
        "llm-run: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let text = if chat {
        &stdout[..]
    } else {
        stdout.strip_prefix(prompt).unwrap()
    };
    Some(text.strip_suffix('\n').unwrap().to_string())
}

fn collect_text(events: &[Event]) -> String {
    events.iter().map(|e| e.text.as_str()).collect()
}

fn run_to_end(session: &mut Session) -> HashMap<u64, Vec<Event>> {
    let mut by_request: HashMap<u64, Vec<Event>> = HashMap::new();
    for _ in 0..10_000 {
        for event in session.step().unwrap() {
            by_request.entry(event.request).or_default().push(event);
        }
        if session.is_idle().unwrap() {
            return by_request;
        }
    }
    panic!("the session never went idle");
}

#[test]
fn greedy_generation_equals_llm_run() {
    let model = match common::model("greedy_equals_llm_run") {
        Some(model) => model,
        None => return,
    };
    let prompt_text = "The capital of France is";
    let expected = match llm_run_greedy(prompt_text, 24, false) {
        Some(text) => text,
        None => return,
    };
    let mut session = common::session(&model);
    let prompt = common::prompt(&model, prompt_text);
    let generation = session
        .generate(&prompt, &GenerateParams::greedy(24))
        .unwrap();
    assert_eq!(generation.text, expected);
    assert_eq!(generation.result.n_prompt_tokens as usize, prompt.len());
    assert_eq!(
        generation.result.n_generated_tokens as usize,
        generation.tokens.len()
    );
}

#[test]
fn greedy_chat_equals_llm_run_chat() {
    let model = match common::model("greedy_chat") {
        Some(model) => model,
        None => return,
    };
    let question = "Name a primary colour.";
    let expected = match llm_run_greedy(question, 16, true) {
        Some(text) => text,
        None => return,
    };
    let templated = model
        .apply_chat_template(&[llminfer::ChatMessage::user(question)], true)
        .unwrap();
    let mut session = common::session(&model);
    let generation = session
        .generate(
            &common::prompt(&model, &templated),
            &GenerateParams::greedy(16),
        )
        .unwrap();
    assert_eq!(generation.text, expected);
}

#[test]
fn streaming_equals_blocking_generation() {
    let model = match common::model("streaming_equals_blocking") {
        Some(model) => model,
        None => return,
    };
    let mut session = common::session(&model);
    let prompt = common::prompt(&model, "Once upon a time");
    let blocking = session
        .generate(&prompt, &GenerateParams::greedy(20))
        .unwrap();

    let events: Vec<Event> = session
        .stream(&prompt, &RequestParams::greedy(20))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let tokens: Vec<i32> = events.iter().filter_map(|e| e.token).collect();
    assert_eq!(tokens, blocking.tokens);
    assert_eq!(collect_text(&events), blocking.text);
    let last = events.last().unwrap();
    assert_eq!(last.finish, blocking.result.finish_reason);
    assert!(events[..events.len() - 1]
        .iter()
        .all(|e| e.finish.is_none()));
    assert!(session.is_idle().unwrap());
}

#[test]
fn several_requests_in_one_session_match_their_solo_runs() {
    let model = match common::model("several_requests") {
        Some(model) => model,
        None => return,
    };
    let mut session = common::session(&model);
    let texts = ["The sky is", "My favourite food is", "1, 2, 3, 4,"];
    let prompts: Vec<Vec<i32>> = texts.iter().map(|t| common::prompt(&model, t)).collect();
    let solo: Vec<String> = prompts
        .iter()
        .map(|p| {
            session
                .generate(p, &GenerateParams::greedy(12))
                .unwrap()
                .text
        })
        .collect();

    let params = RequestParams::greedy(12);
    let ids: Vec<u64> = prompts
        .iter()
        .map(|p| session.submit(p, &params).unwrap())
        .collect();
    let events = run_to_end(&mut session);
    for (id, expected) in ids.iter().zip(&solo) {
        let got = &events[id];
        assert_eq!(&collect_text(got), expected);
        assert!(got.last().unwrap().finish.is_some());
    }
}

#[test]
fn requests_submitted_from_other_threads() {
    let model = match common::model("other_threads") {
        Some(model) => model,
        None => return,
    };
    let mut session = common::session(&model);
    let prompt = common::prompt(&model, "The sky is");
    let expected = session
        .generate(&prompt, &GenerateParams::greedy(8))
        .unwrap()
        .text;
    let handle = session.handle();
    let submitters: Vec<_> = (0..2)
        .map(|_| {
            let handle = handle.clone();
            let prompt = prompt.clone();
            thread::spawn(move || handle.submit(&prompt, &RequestParams::greedy(8)).unwrap())
        })
        .collect();
    let ids: Vec<u64> = submitters.into_iter().map(|t| t.join().unwrap()).collect();
    // Stepping on another thread than the session was made on: Session is Send.
    let events = thread::spawn(move || run_to_end(&mut session))
        .join()
        .unwrap();
    for id in ids {
        assert_eq!(collect_text(&events[&id]), expected);
    }
}

#[test]
fn seeded_sampling_is_reproducible() {
    let model = match common::model("seeded_sampling") {
        Some(model) => model,
        None => return,
    };
    let mut session = common::session(&model);
    let prompt = common::prompt(&model, "In a small village");
    let params = |seed| GenerateParams {
        max_new_tokens: 16,
        sampling: Some(SamplingParams {
            temperature: 1.2,
            ..SamplingParams::seeded(seed)
        }),
        ..GenerateParams::default()
    };
    let first = session.generate(&prompt, &params(42)).unwrap();
    let again = session.generate(&prompt, &params(42)).unwrap();
    assert_eq!(first.tokens, again.tokens);
    let request = RequestParams {
        sampling: params(42).sampling,
        ..RequestParams::greedy(16)
    };
    let streamed = session.stream(&prompt, &request).unwrap().text().unwrap();
    assert_eq!(streamed, first.text, "a request samples as generate does");
}

#[test]
fn cancelling_a_request_finishes_it_as_cancelled() {
    let model = match common::model("cancel") {
        Some(model) => model,
        None => return,
    };
    let mut session = common::session(&model);
    let prompt = common::prompt(&model, "Count: 1, 2, 3,");
    let params = RequestParams {
        ignore_eos: true,
        ..RequestParams::greedy(400)
    };
    let mut stream = session.stream(&prompt, &params).unwrap();
    let mut tokens = 0;
    let mut finish = None;
    let mut cancelled = false;
    while let Some(event) = stream.next() {
        let event = event.unwrap();
        tokens += event.token.is_some() as usize;
        if tokens == 3 && !cancelled {
            stream.cancel().unwrap();
            cancelled = true;
        }
        finish = event.finish.or(finish);
    }
    assert_eq!(finish, Some(FinishReason::Cancelled));
    assert!(tokens < 10, "{} tokens after the cancel", tokens);
    drop(stream);
    assert!(session.is_idle().unwrap());

    // Dropping a stream early cancels its request, and its leftovers never
    // reach step().
    let mut early = session.stream(&prompt, &params).unwrap();
    early.next().unwrap().unwrap();
    drop(early);
    let leftover = run_to_end(&mut session);
    assert!(leftover.is_empty(), "{:?}", leftover.keys());
}

#[test]
fn interrupt_stops_a_running_generate() {
    let model = match common::model("interrupt") {
        Some(model) => model,
        None => return,
    };
    let mut session = common::session(&model);
    let handle = session.handle();
    let done = Arc::new(AtomicBool::new(false));
    let interrupter = {
        let done = done.clone();
        // An interrupt only reaches a call already running, so keep sending.
        thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                thread::sleep(Duration::from_millis(20));
                handle.interrupt();
            }
        })
    };
    let prompt = common::prompt(&model, "Tell me a long story.");
    let params = GenerateParams {
        ignore_eos: true,
        ..GenerateParams::greedy(480)
    };
    let outcome = session.generate(&prompt, &params);
    done.store(true, Ordering::Release);
    interrupter.join().unwrap();
    let err = outcome.unwrap_err();
    assert_eq!(err.status, Status::Cancelled, "{}", err);
    assert_eq!(err.status_name, "LLM_ERR_CANCELLED");
    // Nothing is left behind: the session generates normally afterwards.
    let four = GenerateParams {
        ignore_eos: true,
        ..GenerateParams::greedy(4)
    };
    let after = session.generate(&prompt, &four).unwrap();
    assert_eq!(after.tokens.len(), 4);
}

#[test]
fn an_interrupted_step_is_repeated_by_the_stream() {
    let model = match common::model("interrupted_step") {
        Some(model) => model,
        None => return,
    };
    let mut session = common::session(&model);
    let prompt = common::prompt(&model, "The river");
    let expected = session
        .generate(&prompt, &GenerateParams::greedy(24))
        .unwrap()
        .text;
    let handle = session.handle();
    let done = Arc::new(AtomicBool::new(false));
    let interrupter = {
        let done = done.clone();
        thread::spawn(move || {
            for i in 0..400u64 {
                if done.load(Ordering::Acquire) {
                    break;
                }
                handle.interrupt();
                thread::sleep(Duration::from_millis(1 + i % 7));
            }
        })
    };
    let mut text = String::new();
    let mut interrupted = 0;
    for event in session.stream(&prompt, &RequestParams::greedy(24)).unwrap() {
        match event {
            Ok(event) => text.push_str(&event.text),
            Err(err) => {
                assert_eq!(err.status, Status::Cancelled);
                interrupted += 1;
            }
        }
    }
    done.store(true, Ordering::Release);
    interrupter.join().unwrap();
    assert_eq!(
        text, expected,
        "{} interrupted steps changed the tokens",
        interrupted
    );
}

#[test]
fn callback_can_stop_and_panics_do_not_cross_c() {
    let model = match common::model("callback") {
        Some(model) => model,
        None => return,
    };
    let mut session = common::session(&model);
    let prompt = common::prompt(&model, "Once upon a time");
    let mut seen = 0;
    let result = session
        .generate_with(&prompt, &GenerateParams::greedy(30), |_, _| {
            seen += 1;
            seen < 3
        })
        .unwrap();
    assert_eq!(seen, 3);
    assert_eq!(result.finish_reason, Some(FinishReason::Cancelled));

    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        session.generate_with(&prompt, &GenerateParams::greedy(30), |_, _| {
            panic!("deliberate panic in on_token (caught)")
        })
    }));
    let payload = caught.unwrap_err();
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&"deliberate panic in on_token (caught)")
    );
    // The session is intact after the panic.
    assert_eq!(
        session
            .generate(&prompt, &GenerateParams::greedy(3))
            .unwrap()
            .tokens
            .len(),
        3
    );
}

#[test]
fn logprobs_and_stop_strings() {
    let model = match common::model("logprobs") {
        Some(model) => model,
        None => return,
    };
    let mut session = common::session(&model);
    let prompt = common::prompt(&model, "1, 2, 3, 4,");
    let params = RequestParams {
        logprobs: true,
        top_logprobs: 3,
        stop_strings: vec!["7".to_string()],
        ..RequestParams::greedy(40)
    };
    let events: Vec<Event> = session
        .stream(&prompt, &params)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let text = collect_text(&events);
    assert!(!text.contains('7'), "{:?}", text);
    assert_eq!(events.last().unwrap().finish, Some(FinishReason::Stop));
    let first = &events[0];
    assert_eq!(first.top.len(), 3);
    assert!(first.logprob <= 0.0);
    assert_eq!(
        first.top[0].0,
        first.token.unwrap(),
        "greedy picks the most likely"
    );
}

#[allow(dead_code)]
fn thread_rules(model: Model, session: Session) {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    send_sync(&model);
    send_sync(&session.handle());
    send(&session);
}

#[test]
fn a_stream_with_several_samples_ends_after_each_finished() {
    let model = match common::model("several_samples") {
        Some(model) => model,
        None => return,
    };
    let mut session = common::session(&model);
    let prompt = common::prompt(&model, "A short poem:");
    let single = RequestParams {
        sampling: Some(SamplingParams::seeded(7)),
        ignore_eos: true,
        ..RequestParams::greedy(10)
    };
    let expected = session.stream(&prompt, &single).unwrap().text().unwrap();
    let several = RequestParams {
        n_samples: 3,
        ..single
    };
    let events: Vec<Event> = session
        .stream(&prompt, &several)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let finishes: Vec<u32> = events
        .iter()
        .filter(|e| e.finish.is_some())
        .map(|e| e.sample_index)
        .collect();
    assert_eq!(finishes.len(), 3);
    let sample0: String = events
        .iter()
        .filter(|e| e.sample_index == 0)
        .map(|e| e.text.as_str())
        .collect();
    assert_eq!(sample0, expected, "sample 0 is the single-sample request");
    assert!(session.is_idle().unwrap());
}
