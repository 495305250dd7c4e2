//! Grammars: output constrained by a JSON Schema parses as JSON (with a
//! parser written here, not the library's) and follows the schema, through
//! generate and through requests; regular expressions and compile errors.

mod common;

use llminfer::{
    Batch, DetokenizeFlags, FinishReason, GenerateParams, Grammar, GrammarParams,
    GrammarWhitespace, RequestParams, Sampler, SamplingParams, Status,
};
use std::collections::BTreeMap;

const SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}
  },
  "required": ["name", "age", "tags"],
  "additionalProperties": false
}"#;

#[derive(Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(String),
    Str(String),
    Array(Vec<Json>),
    Object(BTreeMap<String, Json>),
}

/// A strict JSON parser (RFC 8259) for checking the output.
struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn parse(text: &'a str) -> Result<Json, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("trailing text at {}", p.i));
        }
        Ok(v)
    }

    fn ws(&mut self) {
        while self.i < self.s.len() && b" \t\r\n".contains(&self.s[self.i]) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Result<(), String> {
        self.ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected '{}' at {}", c as char, self.i))
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.s.get(self.i) {
            Some(b'{') => {
                self.i += 1;
                let mut map = BTreeMap::new();
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Json::Object(map));
                }
                loop {
                    self.ws();
                    let key = match self.value()? {
                        Json::Str(k) => k,
                        other => return Err(format!("key {:?} is not a string", other)),
                    };
                    self.eat(b':')?;
                    let v = self.value()?;
                    if map.insert(key.clone(), v).is_some() {
                        return Err(format!("key {} twice", key));
                    }
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Json::Object(map));
                        }
                        _ => return Err(format!("bad object at {}", self.i)),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Json::Array(items));
                }
                loop {
                    items.push(self.value()?);
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Json::Array(items));
                        }
                        _ => return Err(format!("bad array at {}", self.i)),
                    }
                }
            }
            Some(b'"') => {
                self.i += 1;
                let mut out = String::new();
                loop {
                    let c = *self.s.get(self.i).ok_or("unterminated string")?;
                    self.i += 1;
                    match c {
                        b'"' => return Ok(Json::Str(out)),
                        b'\\' => {
                            let e = *self.s.get(self.i).ok_or("unterminated escape")?;
                            self.i += 1;
                            match e {
                                b'"' | b'\\' | b'/' => out.push(e as char),
                                b'b' => out.push('\u{8}'),
                                b'f' => out.push('\u{c}'),
                                b'n' => out.push('\n'),
                                b'r' => out.push('\r'),
                                b't' => out.push('\t'),
                                b'u' => {
                                    let hex = self.s.get(self.i..self.i + 4).ok_or("short \\u")?;
                                    let code =
                                        u32::from_str_radix(std::str::from_utf8(hex).unwrap(), 16)
                                            .map_err(|e| e.to_string())?;
                                    self.i += 4;
                                    out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
                                }
                                _ => return Err(format!("bad escape at {}", self.i)),
                            }
                        }
                        c if c < 0x20 => return Err(format!("control character at {}", self.i)),
                        _ => {
                            // Copy a whole UTF-8 character.
                            let start = self.i - 1;
                            while self.i < self.s.len() && (self.s[self.i] & 0xC0) == 0x80 {
                                self.i += 1;
                            }
                            out.push_str(
                                std::str::from_utf8(&self.s[start..self.i])
                                    .map_err(|e| e.to_string())?,
                            );
                        }
                    }
                }
            }
            Some(b't') if self.s[self.i..].starts_with(b"true") => {
                self.i += 4;
                Ok(Json::Bool(true))
            }
            Some(b'f') if self.s[self.i..].starts_with(b"false") => {
                self.i += 5;
                Ok(Json::Bool(false))
            }
            Some(b'n') if self.s[self.i..].starts_with(b"null") => {
                self.i += 4;
                Ok(Json::Null)
            }
            Some(c) if *c == b'-' || c.is_ascii_digit() => {
                let start = self.i;
                if self.s[self.i] == b'-' {
                    self.i += 1;
                }
                let digits = |p: &mut Parser| {
                    let s = p.i;
                    while p.i < p.s.len() && p.s[p.i].is_ascii_digit() {
                        p.i += 1;
                    }
                    p.i - s
                };
                let int_start = self.i;
                let n = digits(self);
                if n == 0 || (n > 1 && self.s[int_start] == b'0') {
                    return Err(format!("bad number at {}", start));
                }
                if self.s.get(self.i) == Some(&b'.') {
                    self.i += 1;
                    if digits(self) == 0 {
                        return Err(format!("bad fraction at {}", start));
                    }
                }
                if matches!(self.s.get(self.i), Some(b'e') | Some(b'E')) {
                    self.i += 1;
                    if matches!(self.s.get(self.i), Some(b'+') | Some(b'-')) {
                        self.i += 1;
                    }
                    if digits(self) == 0 {
                        return Err(format!("bad exponent at {}", start));
                    }
                }
                Ok(Json::Number(
                    String::from_utf8(self.s[start..self.i].to_vec()).unwrap(),
                ))
            }
            _ => Err(format!("unexpected text at {}", self.i)),
        }
    }
}

/// The output is JSON that SCHEMA accepts.
fn check_person(text: &str) {
    let value = Parser::parse(text).unwrap_or_else(|e| panic!("{:?} is not JSON: {}", text, e));
    let map = match value {
        Json::Object(map) => map,
        other => panic!("not an object: {:?}", other),
    };
    let keys: Vec<&str> = map.keys().map(|k| k.as_str()).collect();
    assert_eq!(keys, ["age", "name", "tags"], "{}", text);
    match &map["name"] {
        Json::Str(name) => assert!(name.chars().count() <= 12, "{}", text),
        other => panic!("name {:?}", other),
    }
    match &map["age"] {
        Json::Number(n) => assert!(n.parse::<i64>().is_ok(), "age {} is no integer", n),
        other => panic!("age {:?}", other),
    }
    match &map["tags"] {
        Json::Array(tags) => {
            assert!(tags.len() <= 3, "{}", text);
            for tag in tags {
                assert!(
                    *tag == Json::Str("a".into()) || *tag == Json::Str("b".into()),
                    "{}",
                    text
                );
            }
        }
        other => panic!("tags {:?}", other),
    }
}

#[test]
fn the_json_checker_rejects_what_it_should() {
    assert!(Parser::parse(r#"{"a":[1,2.5e3,"x\u0041"],"b":null}"#).is_ok());
    for bad in [
        r#"{"a":1,}"#,
        r#"{"a" 1}"#,
        "[01]",
        r#""abc"#,
        "{} x",
        "tru",
    ] {
        assert!(Parser::parse(bad).is_err(), "{} parsed", bad);
    }
}

#[test]
fn json_schema_output_parses_and_follows_the_schema() {
    let model = match common::model("json_schema_output_parses_and_follows_the_schema") {
        Some(m) => m,
        None => return,
    };
    let mut session = common::session(&model);
    let prompt = common::prompt(&model, "A person as JSON:\n");
    for whitespace in [GrammarWhitespace::Compact, GrammarWhitespace::Flexible] {
        let params = GrammarParams {
            whitespace,
            ..GrammarParams::default()
        };
        let grammar = Grammar::json_schema(&model, SCHEMA, &params).unwrap();
        for (seed, temperature) in [(0u64, 0.0f32), (1, 1.0), (2, 1.0)] {
            let sampling = SamplingParams {
                temperature,
                seed,
                grammar: Some(grammar.clone()),
                ..SamplingParams::default()
            };
            let g = session
                .generate(
                    &prompt,
                    &GenerateParams {
                        sampling: Some(sampling),
                        ..GenerateParams::greedy(160)
                    },
                )
                .unwrap();
            let finish = g.result.finish_reason;
            assert!(
                finish == Some(FinishReason::Stop) || finish == Some(FinishReason::Eos),
                "{:?}: {:?}",
                finish,
                g.text
            );
            check_person(&g.text);
        }
    }

    // A request holds its grammar: the program's handle may go at once.
    let grammar = Grammar::json_schema(&model, SCHEMA, &GrammarParams::default()).unwrap();
    let params = RequestParams {
        sampling: Some(SamplingParams {
            temperature: 1.0,
            seed: 7,
            grammar: Some(grammar),
            ..SamplingParams::default()
        }),
        ..RequestParams::greedy(160)
    };
    let id = session.submit(&prompt, &params).unwrap();
    drop(params);
    let mut text = String::new();
    'run: loop {
        for event in session.step().unwrap() {
            assert_eq!(event.request, id);
            text.push_str(&event.text);
            if event.finish.is_some() {
                break 'run;
            }
        }
    }
    check_person(&text);
}

#[test]
fn regex_and_ebnf_constrain_the_output() {
    let model = match common::model("regex_and_ebnf_constrain_the_output") {
        Some(m) => m,
        None => return,
    };
    let mut session = common::session(&model);
    let prompt = common::prompt(&model, "Is Paris in France?");
    let regex = Grammar::regex(&model, "(yes|no)!", &GrammarParams::default()).unwrap();
    let ebnf = Grammar::ebnf(
        &model,
        "answer ::= \"Answer: \" [0-9] [0-9]?",
        &GrammarParams {
            root: Some("answer".into()),
            ..GrammarParams::default()
        },
    )
    .unwrap();
    for seed in 0..3u64 {
        let mut run = |grammar: &Grammar| {
            let sampling = SamplingParams {
                temperature: 1.0,
                seed,
                grammar: Some(grammar.clone()),
                ..SamplingParams::default()
            };
            let params = GenerateParams {
                sampling: Some(sampling),
                ..GenerateParams::greedy(16)
            };
            session.generate(&prompt, &params).unwrap().text
        };
        let text = run(&regex);
        assert!(text == "yes!" || text == "no!", "{:?}", text);
        let text = run(&ebnf);
        let digits = text.strip_prefix("Answer: ").expect(&text);
        assert!(
            (1..=2).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()),
            "{:?}",
            text
        );
    }
}

#[test]
fn compile_errors_say_where() {
    let model = match common::model("compile_errors_say_where") {
        Some(m) => m,
        None => return,
    };
    let defaults = GrammarParams::default();
    let err = Grammar::json_schema(
        &model,
        r#"{"properties": {"x": {"type": "number", "minimum": 1}}}"#,
        &defaults,
    )
    .unwrap_err();
    assert_eq!(err.status, Status::Unsupported, "{}", err);
    assert!(err.message.contains("/properties/x/minimum"), "{}", err);
    let err = Grammar::json_schema(&model, "{not json", &defaults).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{}", err);
    let err = Grammar::ebnf(&model, "root ::= [", &defaults).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{}", err);
    assert!(err.message.contains("1:10"), "{}", err);
    let err = Grammar::regex(&model, "(a", &defaults).unwrap_err();
    assert!(!err.message.is_empty());
}

#[test]
fn a_sampler_keeps_and_follows_its_grammar() {
    let model = match common::model("a_sampler_keeps_and_follows_its_grammar") {
        Some(m) => m,
        None => return,
    };
    let grammar = Grammar::regex(&model, "(yes|no)!", &GrammarParams::default()).unwrap();
    let params = SamplingParams {
        temperature: 1.0,
        grammar: Some(grammar),
        ..SamplingParams::default()
    };
    let mut sampler = Sampler::new(&model, &params, 0).unwrap();
    drop(params); // the sampler holds the grammar
    let mut session = common::session(&model);
    let seq = session.seq_open().unwrap();
    let mut history = common::prompt(&model, "Is Paris in France?");
    let mut batch = Batch::new(history.len() as u32).unwrap();
    batch.add_sequence(seq, 0, &history).unwrap();
    let mut generated = Vec::new();
    for n in 0..4u32 {
        session.decode(&batch).unwrap();
        let logits = session.logits(batch.len() - 1).unwrap();
        let token = sampler
            .sample(&logits, &history, n, history.len() as u64)
            .unwrap();
        generated.push(token);
        history.push(token);
        let text = model.detokenize(&generated, DetokenizeFlags::NONE).unwrap();
        assert!(
            "yes!".starts_with(&text) || "no!".starts_with(&text),
            "{:?}",
            text
        );
        if text == "yes!" || text == "no!" {
            return;
        }
        batch.clear();
        batch
            .add(seq, history.len() as u32 - 1, token, true)
            .unwrap();
    }
    panic!("no complete answer in 4 tokens: {:?}", generated);
}
