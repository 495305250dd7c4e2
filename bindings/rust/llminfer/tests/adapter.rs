//! LoRA adapters: an adapter this test writes changes greedy output the
//! way llm-run's `--lora` does; scale 0 is the base model bit for bit;
//! requests and sequences keep their adapter alive; bad files are errors.

mod common;

use llminfer::{
    Adapter, Batch, GenerateParams, Model, RequestParams, Session, SessionParams, Status, Token,
};
use std::path::PathBuf;
use std::process::Command;

const PROMPT: &str = "The capital of France is";

/// FNV-1a 64 of the test adapter for SmolLM2-135M; the Go binding's tests
/// (bindings/go/adapter_test.go) write the same bytes.
const TEST_ADAPTER_FNV: u64 = 0x6a94_5cb9_facd_1df6;

/// A llama.cpp LoRA GGUF for the model's shapes, written here with no
/// library: rank 4, alpha 8, on attn_q and ffn_up of every layer; values
/// (u - 0.5) / 2 from splitmix64 (seed 31) with u the top 24 bits over
/// 2^24, A before B, layer by layer.
fn write_test_adapter(model: &Model, name: &str) -> PathBuf {
    let info = model.info().unwrap();
    const RANK: u64 = 4;
    let mut state: u64 = 31;
    let mut next = move || -> f32 {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / 16_777_216.0 - 0.5) * 0.5
    };
    let mut tensors: Vec<(String, [u64; 2], Vec<f32>)> = Vec::new();
    let (embd, ff) = (info.n_embd as u64, info.n_ff as u64);
    for layer in 0..info.n_layers {
        for &(target, n_in, n_out) in &[("attn_q", embd, embd), ("ffn_up", embd, ff)] {
            let a: Vec<f32> = (0..RANK * n_in).map(|_| next()).collect();
            let b: Vec<f32> = (0..n_out * RANK).map(|_| next()).collect();
            let prefix = format!("blk.{}.{}.weight", layer, target);
            tensors.push((format!("{}.lora_a", prefix), [n_in, RANK], a));
            tensors.push((format!("{}.lora_b", prefix), [RANK, n_out], b));
        }
    }
    let mut f: Vec<u8> = Vec::new();
    fn text(f: &mut Vec<u8>, s: &str) {
        f.extend_from_slice(&(s.len() as u64).to_le_bytes());
        f.extend_from_slice(s.as_bytes());
    }
    let pad = |n: usize| (n + 31) / 32 * 32;
    f.extend_from_slice(b"GGUF");
    f.extend_from_slice(&3u32.to_le_bytes());
    f.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    f.extend_from_slice(&4u64.to_le_bytes());
    for (key, value) in [
        ("general.architecture", info.architecture.as_str()),
        ("general.type", "adapter"),
        ("adapter.type", "lora"),
    ] {
        text(&mut f, key);
        f.extend_from_slice(&8u32.to_le_bytes()); // string
        text(&mut f, value);
    }
    text(&mut f, "adapter.lora.alpha");
    f.extend_from_slice(&6u32.to_le_bytes()); // f32
    f.extend_from_slice(&8f32.to_le_bytes());
    let mut offset = 0usize;
    for (name, ne, values) in &tensors {
        text(&mut f, name);
        f.extend_from_slice(&2u32.to_le_bytes());
        f.extend_from_slice(&ne[0].to_le_bytes());
        f.extend_from_slice(&ne[1].to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes()); // F32
        f.extend_from_slice(&(offset as u64).to_le_bytes());
        offset = pad(offset + 4 * values.len());
    }
    f.resize(pad(f.len()), 0);
    let base = f.len();
    for (_, _, values) in &tensors {
        for v in values {
            f.extend_from_slice(&v.to_le_bytes());
        }
        f.resize(base + pad(f.len() - base), 0);
    }
    if info.n_layers == 30 && info.n_embd == 576 && info.n_ff == 1536 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &byte in &f {
            h = (h ^ byte as u64).wrapping_mul(0x100_0000_01b3);
        }
        assert_eq!(h, TEST_ADAPTER_FNV, "the test adapter's bytes changed");
    }
    let path = std::env::temp_dir().join(format!("llminfer-rust-{}-{}", std::process::id(), name));
    std::fs::write(&path, &f).unwrap();
    path
}

fn greedy(
    session: &mut Session,
    prompt: &[Token],
    adapter: Option<&Adapter>,
    scale: f32,
) -> (Vec<Token>, String) {
    let params = GenerateParams {
        ignore_eos: true,
        adapter: adapter.cloned(),
        adapter_scale: scale,
        ..GenerateParams::greedy(16)
    };
    let g = session.generate(prompt, &params).unwrap();
    (g.tokens, g.text)
}

#[test]
fn adapter_output_matches_llm_run() {
    let model = match common::model("adapter_output_matches_llm_run") {
        Some(m) => m,
        None => return,
    };
    let path = write_test_adapter(&model, "matches.gguf");
    let adapter = Adapter::load(&model, &path).unwrap();
    std::fs::remove_file(&path).ok(); // loaded: the file is no longer read
    let mut session = common::session(&model);
    let prompt = common::prompt(&model, PROMPT);
    let (with, text) = greedy(&mut session, &prompt, Some(&adapter), 0.5);
    let (without, _) = greedy(&mut session, &prompt, None, 1.0);
    assert_ne!(with, without, "the adapter changed nothing");
    match std::env::var("LLMINFER_RUN") {
        Ok(run) if !run.is_empty() => {
            let path = write_test_adapter(&model, "llm-run.gguf");
            let output = Command::new(run)
                .args(["-q", "-m", &std::env::var("LLMINFER_TEST_MODEL").unwrap()])
                .args(["-p", PROMPT, "-n", "16", "--temp", "0", "-t", "1"])
                .args(["--lora", path.to_str().unwrap(), "--lora-scale", "0.5"])
                .output()
                .expect("running llm-run");
            std::fs::remove_file(&path).ok();
            assert!(
                output.status.success(),
                "llm-run: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            assert_eq!(
                format!("{}{}\n", PROMPT, text),
                String::from_utf8(output.stdout).unwrap()
            );
        }
        _ => common::skip("skipped the llm-run --lora comparison: LLMINFER_RUN is not set"),
    }

    // A request (and a stream) gives the same tokens, and holds the adapter
    // only while it runs; dropping our handle meanwhile frees nothing.
    let params = RequestParams {
        ignore_eos: true,
        adapter: Some(adapter.clone()),
        adapter_scale: 0.5,
        ..RequestParams::greedy(16)
    };
    let streamed: Vec<Token> = session
        .stream(&prompt, &params)
        .unwrap()
        .map(|e| e.unwrap().token)
        .flatten()
        .collect();
    assert_eq!(streamed, with);
    assert_eq!(session.adapter_uses(&adapter), 0);
    let id = session.submit(&prompt, &params).unwrap();
    assert_eq!(session.adapter_uses(&adapter), 1);
    let probe = adapter.clone();
    drop(adapter);
    drop(params);
    let mut tokens = Vec::new();
    'run: loop {
        for event in session.step().unwrap() {
            assert_eq!(event.request, id);
            tokens.extend(event.token);
            if event.finish.is_some() {
                break 'run;
            }
        }
    }
    assert_eq!(tokens, with);
    assert_eq!(session.adapter_uses(&probe), 0);
}

fn prompt_logits(
    session: &mut Session,
    prompt: &[Token],
    adapter: Option<(&Adapter, f32)>,
) -> Vec<f32> {
    let seq = session.seq_open().unwrap();
    if let Some((adapter, scale)) = adapter {
        session.seq_set_adapter(seq, Some(adapter), scale).unwrap();
    }
    let mut batch = Batch::new(prompt.len() as u32).unwrap();
    batch.add_sequence(seq, 0, prompt).unwrap();
    session.decode(&batch).unwrap();
    let logits = session.logits(batch.len() - 1).unwrap();
    session.seq_close(seq).unwrap();
    logits
}

#[test]
fn sequences_take_an_adapter_and_scale() {
    let model = match common::model("sequences_take_an_adapter_and_scale") {
        Some(m) => m,
        None => return,
    };
    let path = write_test_adapter(&model, "sequences.gguf");
    let adapter = Adapter::load(&model, &path).unwrap();
    std::fs::remove_file(&path).ok();
    let mut session = common::session(&model);
    let prompt = common::prompt(&model, PROMPT);
    let base = prompt_logits(&mut session, &prompt, None);
    let zero = prompt_logits(&mut session, &prompt, Some((&adapter, 0.0)));
    let same = base
        .iter()
        .zip(&zero)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "scale 0 is not the base model bit for bit");
    let half = prompt_logits(&mut session, &prompt, Some((&adapter, 0.5)));
    let moved = base
        .iter()
        .zip(&half)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        moved > 0.1,
        "scale 0.5 moved the logits by at most {}",
        moved
    );
    assert_eq!(
        session.adapter_uses(&adapter),
        0,
        "closed sequences still hold the adapter"
    );

    // Greedy decoding by hand with the adapter gives generate's tokens; a
    // fork keeps the adapter; a sequence with tokens cannot change it.
    let (want, _) = greedy(&mut session, &prompt, Some(&adapter), 0.5);
    let seq = session.seq_open().unwrap();
    session.seq_set_adapter(seq, Some(&adapter), 0.5).unwrap();
    let fork = session.seq_fork(seq).unwrap();
    assert_eq!(session.adapter_uses(&adapter), 2);
    let mut batch = Batch::new(prompt.len() as u32).unwrap();
    batch.add_sequence(seq, 0, &prompt).unwrap();
    let mut got = Vec::new();
    while got.len() < want.len() {
        session.decode(&batch).unwrap();
        let logits = session.logits(batch.len() - 1).unwrap();
        let best = (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
        got.push(best as Token);
        batch.clear();
        let pos = session.seq_len(seq).unwrap();
        batch.add(seq, pos, best as Token, true).unwrap();
    }
    assert_eq!(got, want);
    let err = session.seq_set_adapter(seq, None, 1.0).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{}", err);
    assert!(!err.message.is_empty());
    session.seq_close(seq).unwrap();
    session.seq_close(fork).unwrap();
    assert_eq!(session.adapter_uses(&adapter), 0);
}

#[test]
fn bad_adapters_are_errors() {
    let model = match common::model("bad_adapters_are_errors") {
        Some(m) => m,
        None => return,
    };
    let missing = std::env::temp_dir().join("llminfer-no-such-lora.gguf");
    let err = Adapter::load(&model, &missing).unwrap_err();
    assert_eq!(err.status, Status::Io, "{}", err);
    assert!(
        err.message.contains("llminfer-no-such-lora.gguf"),
        "{}",
        err.message
    );
    // A model is a GGUF file, but not an adapter.
    let err = Adapter::load(&model, std::env::var("LLMINFER_TEST_MODEL").unwrap()).unwrap_err();
    assert_eq!(err.status, Status::BadFormat, "{}", err);
    assert!(!err.message.is_empty());
    // An adapter of another model is refused where it is used.
    let path = write_test_adapter(&model, "other.gguf");
    let other = Model::load(std::env::var("LLMINFER_TEST_MODEL").unwrap()).unwrap();
    let adapter = Adapter::load(&other, &path).unwrap();
    std::fs::remove_file(&path).ok();
    let session = Session::new(
        &model,
        &SessionParams {
            n_ctx: 256,
            n_threads: 1,
            ..SessionParams::default()
        },
    )
    .unwrap();
    let prompt = common::prompt(&model, PROMPT);
    let params = RequestParams {
        adapter: Some(adapter.clone()),
        ..RequestParams::greedy(2)
    };
    let err = session.submit(&prompt, &params).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{}", err);
    assert_eq!(
        session.adapter_uses(&adapter),
        0,
        "a refused request holds the adapter"
    );
}
