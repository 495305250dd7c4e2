//! Session::new_on: where a session runs. The library's reasons come back
//! as errors, and 3 CPU ranks give one rank's greedy tokens (SmolLM2's 9
//! heads split in 1, 3 or 9).

mod common;

use llminfer::{DeviceParams, GenerateParams, Model, Session, SessionParams, Status};

fn params() -> SessionParams {
    SessionParams {
        n_ctx: 512,
        n_threads: 1,
        kv_cache_bytes: 32 << 20,
        ..SessionParams::default()
    }
}

fn gpu_present() -> bool {
    std::process::Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .map(|o| o.status.success() && o.stdout.starts_with(b"GPU "))
        .unwrap_or(false)
}

fn device(backend: &str, tensor_parallel: u32, devices: &[i32]) -> DeviceParams {
    DeviceParams {
        backend: backend.to_string(),
        tensor_parallel,
        devices: devices.to_vec(),
    }
}

fn greedy(model: &Model, on: Option<DeviceParams>) -> Vec<i32> {
    let mut session = match on {
        Some(d) => Session::new_on(model, &params(), &d).unwrap(),
        None => Session::new(model, &params()).unwrap(),
    };
    let prompt = common::prompt(model, "The capital of Germany is");
    session
        .generate(&prompt, &GenerateParams::greedy(8))
        .unwrap()
        .tokens
}

#[test]
fn refusals_say_why() {
    let model = match common::model("refusals_say_why") {
        Some(model) => model,
        None => return,
    };
    let cases = [
        (
            device("bogus", 1, &[]),
            Status::Unsupported,
            "no backend named 'bogus'",
        ),
        (device("cpu", 2, &[]), Status::Unsupported, "do not split"),
        (device("cpu", 3, &[0]), Status::InvalidArgument, "devices"),
    ];
    for (d, status, text) in cases {
        let err = Session::new_on(&model, &params(), &d).unwrap_err();
        assert_eq!(err.status, status, "{:?}: {}", d, err.message);
        assert!(err.message.contains(text), "{:?}: {}", d, err.message);
    }
    if !gpu_present() {
        let err = Session::new_on(&model, &params(), &device("cuda", 1, &[])).unwrap_err();
        assert!(
            err.message.contains("backend 'cuda' is not available"),
            "{}",
            err.message
        );
    }
}

#[test]
fn ranks_give_one_ranks_tokens() {
    let model = match common::model("ranks_give_one_ranks_tokens") {
        Some(model) => model,
        None => return,
    };
    let one = greedy(&model, None);
    assert!(!one.is_empty());
    assert_eq!(greedy(&model, Some(device("cpu", 1, &[]))), one);
    assert_eq!(greedy(&model, Some(device("cpu", 3, &[]))), one);
    assert_eq!(greedy(&model, Some(device("cpu", 3, &[0, 0, 0]))), one);
    if !gpu_present() {
        assert_eq!(greedy(&model, Some(device("auto", 1, &[]))), one);
    }
}
