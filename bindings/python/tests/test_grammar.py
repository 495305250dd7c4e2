import json

import pytest

import llminfer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def test_generate_follows_schema(session, model):
    with llminfer.Grammar.from_json_schema(model, SCHEMA) as grammar:
        for seed, temperature in ((0, 0.0), (1, 1.0), (2, 1.0)):
            params = llminfer.SamplingParams(temperature=temperature, seed=seed, grammar=grammar)
            result = session.generate("A person as JSON:\n", max_new_tokens=120, sampling=params)
            assert result.finish_reason in (llminfer.FinishReason.STOP, llminfer.FinishReason.EOS)
            value = json.loads(result.text)
            assert set(value) == {"name", "age", "tags"}
            assert isinstance(value["age"], int) and len(value["name"]) <= 12
            assert all(t in ("a", "b") for t in value["tags"]) and len(value["tags"]) <= 3


def test_state_mask_and_rollback(model):
    with llminfer.Grammar.from_regex(model, "(yes|no)!") as grammar, grammar.state() as state:
        allowed = state.allowed_tokens()
        assert allowed
        for token in allowed:
            text = model.detokenize([token])
            assert "yes!".startswith(text) or "no!".startswith(text)
        yes = model.tokenize("yes!")
        for token in yes:
            state.accept(token)
        assert state.is_complete() and state.can_end()
        state.rollback(1)
        assert not state.can_end()
        with state.fork() as copy:
            copy.accept(yes[-1])
            assert copy.is_complete()
        with pytest.raises(llminfer.InvalidArgumentError):
            state.accept(model.tokenize("no")[0])


def test_compile_errors_name_the_place(model):
    with pytest.raises(llminfer.UnsupportedError, match="/properties/x/minimum"):
        llminfer.Grammar.from_json_schema(
            model, {"properties": {"x": {"type": "number", "minimum": 1}}})
    with pytest.raises(llminfer.InvalidArgumentError, match="1:10"):
        llminfer.Grammar.from_ebnf(model, "root ::= [")
    with pytest.raises(ValueError):
        llminfer.Grammar.from_json_schema(model, {}, whitespace="loose")
