//! The KV cache element types, the quantized ones of libllminfer 1.4 included.

mod common;

use llminfer::{GenerateParams, KvType, Session, SessionParams, Token};

fn greedy(model: &llminfer::Model, kv_type: KvType, prompt: &[Token]) -> Vec<Token> {
    let params = SessionParams {
        n_ctx: 256,
        n_threads: 1,
        kv_type,
        ..SessionParams::default()
    };
    let mut session = Session::new(model, &params).expect("creating a session");
    let mut gen = GenerateParams::greedy(12);
    gen.ignore_eos = true;
    session.generate(prompt, &gen).unwrap().tokens
}

#[test]
fn q8_0_follows_f16() {
    let model = match common::model("q8_0_follows_f16") {
        Some(model) => model,
        None => return,
    };
    let prompt = common::prompt(
        &model,
        "The history of the printing press begins in the fifteenth century, when",
    );
    let f16 = greedy(&model, KvType::F16, &prompt);
    let q8 = greedy(&model, KvType::Q8_0, &prompt);
    let q4 = greedy(&model, KvType::Q4_0, &prompt);
    assert_eq!((f16.len(), q8.len(), q4.len()), (12, 12, 12));
    // SmolLM2-135M: the first 19 greedy tokens agree (tests/unit/test_kvquant.c).
    assert_eq!(q8[..8], f16[..8]);
}
