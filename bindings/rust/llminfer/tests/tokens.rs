//! Token level: sequences decoded by the host, saved states and the
//! standalone sampler, checked against the library's own generation (the
//! request path, not this one) and against an argmax computed here.

mod common;

use llminfer::{Batch, GenerateParams, Sampler, SamplingParams, Session, SessionParams, Status};

fn argmax(logits: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as i32
}

/// Greedy decoding of `n` tokens after `prompt` on sequence `seq`, by hand.
fn decode_greedy(session: &mut Session, seq: i32, prompt: &[i32], n: usize) -> Vec<i32> {
    let mut batch = Batch::new(prompt.len() as u32).unwrap();
    let start = session.seq_len(seq).unwrap();
    batch.add_sequence(seq, start, prompt).unwrap();
    session.decode(&batch).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let logits = session.logits(batch.len() - 1).unwrap();
        let token = argmax(&logits);
        out.push(token);
        batch.clear();
        let pos = session.seq_len(seq).unwrap();
        batch.add(seq, pos, token, true).unwrap();
        session.decode(&batch).unwrap();
    }
    out
}

#[test]
fn host_decoding_gives_the_generated_tokens() {
    let model = match common::model("host_decoding_gives_the_generated_tokens") {
        Some(model) => model,
        None => return,
    };
    let prompt = common::prompt(&model, "The capital of Germany is");
    let mut session = common::session(&model);
    let generated = session
        .generate(&prompt, &GenerateParams::greedy(8))
        .unwrap();
    assert!(!generated.tokens.is_empty());
    let seq = session.seq_open().unwrap();
    let by_hand = decode_greedy(&mut session, seq, &prompt, generated.tokens.len());
    assert_eq!(by_hand, generated.tokens);
    let held = session.seq_tokens(seq).unwrap();
    assert_eq!(held.len(), prompt.len() + by_hand.len());
    assert_eq!(&held[..prompt.len()], &prompt[..]);
    // Truncate and fork: a branch from the prompt decodes the same again.
    session.seq_truncate(seq, prompt.len() as u32).unwrap();
    let fork = session.seq_fork(seq).unwrap();
    assert_eq!(session.seq_len(fork).unwrap(), prompt.len() as u32);
    assert_eq!(
        decode_greedy(&mut session, fork, &by_hand[..1], 3),
        by_hand[1..4].to_vec()
    );
    session.seq_close(fork).unwrap();
    session.seq_close(seq).unwrap();
    assert!(session.seq_len(seq).is_err());
}

#[test]
fn saved_states_continue_exactly() {
    let model = match common::model("saved_states_continue_exactly") {
        Some(model) => model,
        None => return,
    };
    let prompt = common::prompt(&model, "Once upon a time");
    let mut a = common::session(&model);
    let seq = a.seq_open().unwrap();
    decode_greedy(&mut a, seq, &prompt, 2);
    let state = a.seq_state_save(seq).unwrap();
    let whole = a.state_save().unwrap();

    // Into another session: the next logits are bitwise the original's.
    let params = SessionParams {
        n_ctx: 512,
        n_threads: 1,
        ..SessionParams::default()
    };
    let mut b = Session::new(&model, &params).unwrap();
    let loaded = b.seq_state_load(&state).unwrap();
    assert_eq!(b.seq_tokens(loaded).unwrap(), a.seq_tokens(seq).unwrap());
    let last = *a.seq_tokens(seq).unwrap().last().unwrap();
    let step = |s: &mut Session, id: i32| {
        let mut batch = Batch::new(1).unwrap();
        s.seq_truncate(id, s.seq_len(id).unwrap() - 1).unwrap();
        batch.add(id, s.seq_len(id).unwrap(), last, true).unwrap();
        s.decode(&batch).unwrap();
        s.logits(0).unwrap()
    };
    let la = step(&mut a, seq);
    let lb = step(&mut b, loaded);
    assert!(la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()));

    // A whole-session state keeps the ids; loading it twice is refused.
    let mut c = Session::new(&model, &params).unwrap();
    c.state_load(&whole).unwrap();
    assert_eq!(c.seq_tokens(seq).unwrap().len(), prompt.len() + 2);
    let err = c.state_load(&whole).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    // Corrupt data is a clear error, not a crash.
    let mut bad = state.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    let err = c.seq_state_load(&bad).unwrap_err();
    assert_eq!(err.status, Status::BadFormat, "{}", err.message);
}

#[test]
fn sampler_is_greedy_or_seeded() {
    let model = match common::model("sampler_is_greedy_or_seeded") {
        Some(model) => model,
        None => return,
    };
    let prompt = common::prompt(&model, "Hello, how are you?");
    assert!(prompt.len() > 1);
    let mut session = common::session(&model);
    let seq = session.seq_open().unwrap();
    let mut batch = Batch::new(prompt.len() as u32).unwrap();
    batch.add_sequence(seq, 0, &prompt).unwrap();
    session.decode(&batch).unwrap();
    let logits = session.logits(batch.len() - 1).unwrap();

    let mut greedy = Sampler::new(&model, &SamplingParams::greedy(), 0).unwrap();
    assert_eq!(
        greedy.sample(&logits, &prompt, 0, 1).unwrap(),
        argmax(&logits)
    );

    let params = SamplingParams {
        temperature: 1.5,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplingParams::seeded(42)
    };
    let mut s1 = Sampler::new(&model, &params, 7).unwrap();
    let mut s2 = Sampler::new(&model, &params, 7).unwrap();
    let draws: Vec<i32> = (0..16)
        .map(|p| s1.sample(&logits, &prompt, 0, p).unwrap())
        .collect();
    let again: Vec<i32> = (0..16)
        .map(|p| s2.sample(&logits, &prompt, 0, p).unwrap())
        .collect();
    assert_eq!(
        draws, again,
        "same seed, stream and positions give the same tokens"
    );
    let distinct: std::collections::HashSet<_> = draws.iter().collect();
    assert!(
        distinct.len() > 1,
        "a hot sampler drew one token 16 times: {:?}",
        draws
    );

    let err = greedy.sample(&logits[..10], &prompt, 0, 1).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    // A row that did not ask for logits, and a position that skips.
    assert!(session.logits(0).is_err());
    batch.clear();
    batch.add(seq, 99, prompt[0], true).unwrap();
    assert!(session.decode(&batch).is_err());
}
