import json
from pathlib import Path

import pytest

import llminfer
from conftest import model_path


def test_missing_file_is_an_io_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.gguf"
    with pytest.raises(llminfer.LlmIOError) as caught:
        llminfer.Model(missing)
    assert caught.value.status == llminfer.Status.IO
    assert caught.value.status_name == "LLM_ERR_IO"
    assert "missing.gguf" in caught.value.message


def test_garbage_file_is_a_format_error(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"this is not a GGUF file at all" * 100)
    with pytest.raises(llminfer.LlmError) as caught:
        llminfer.Model(garbage)
    assert caught.value.status_name == "LLM_ERR_BAD_FORMAT"
    assert isinstance(caught.value, llminfer.BadFormatError)
    assert caught.value.message


def test_info(model: llminfer.Model) -> None:
    info = model.info
    assert info.architecture == "llama"
    assert info.n_vocab > 1000 and info.n_layers > 0
    assert info.has_chat_template
    assert info.eos is not None


def test_tokenize_detokenize_round_trip(model: llminfer.Model) -> None:
    text = "Hello, world! Ünïcödé text and 数字 123."
    tokens = model.tokenize(text, add_special=False)
    assert tokens and all(isinstance(t, int) for t in tokens)
    assert model.detokenize(tokens) == text
    long_text = "a fairly long sentence to force buffers to grow. " * 200
    assert model.detokenize(model.tokenize(long_text, add_special=False)) == long_text


def test_special_tokens(model: llminfer.Model) -> None:
    parsed = model.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert len(parsed) == 1
    assert model.detokenize(parsed) == ""
    assert model.detokenize(parsed, special=True) == "<|im_start|>"


def test_invalid_and_strict_tokenize(model: llminfer.Model) -> None:
    with pytest.raises(llminfer.InvalidArgumentError) as caught:
        model.tokenize("a\x04b", strict=True)
    assert caught.value.status_name == "LLM_ERR_INVALID_ARGUMENT"


def test_streaming_detokenizer(model: llminfer.Model) -> None:
    text = "naïve café ☕ done"
    tokens = model.tokenize(text, add_special=False)
    with model.detokenizer() as detok:
        pieces = [detok.push(t) for t in tokens]
        pieces.append(detok.flush())
    assert "".join(pieces) == text


def test_chat_template(model: llminfer.Model) -> None:
    rendered = model.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, ("user", "Hi there")]
    )
    assert "Be brief." in rendered and "Hi there" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")
    closed = model.apply_chat_template([("user", "Hi")], add_generation_prompt=False)
    assert not closed.endswith("assistant\n")


def test_chat_template_variables(model: llminfer.Model) -> None:
    assert model.chat_template is not None and "<|im_start|>" in model.chat_template
    assert model.named_chat_template("default") == model.chat_template
    assert model.named_chat_template("tool_use") is None
    # a name of one of the model's templates runs it, like transformers' chat_template=
    assert model.apply_chat_template([("user", "Hi")], chat_template="default") == \
        model.apply_chat_template([("user", "Hi")])
    template = (
        "{% for m in messages %}{{ m.role }}:{% if m.content is string %}{{ m.content }}"
        "{% else %}{{ m.content | map(attribute='text') | join }}{% endif %}"
        "{% for c in m.tool_calls | default([]) %}<{{ c.function.name }} "
        "{{ c.function.arguments | tojson }}>{% endfor %};{% endfor %}"
        "{{ tools | map(attribute='function.name') | join(',') }}|{{ documents }}|"
        "{{ enable_thinking }}|{{ add_generation_prompt }}"
    )
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Wetter "},
                                     {"type": "text", "text": "in Köln?"}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": {"city": "Köln"}}}]},
        {"role": "tool", "tool_call_id": "1", "content": "12°C"},
    ]
    tools = [{"type": "function", "function": {"name": "weather"}}]
    rendered = model.apply_chat_template(messages, tools=tools, chat_template=template,
                                         add_generation_prompt=False, enable_thinking=False)
    want = ('user:Wetter in Köln?;assistant:<weather {"city": "Köln"}>;tool:12°C;'
            "weather|None|False|False")
    assert rendered == want
    # the same template in jinja2, as transformers sets it up, when it is installed
    jinja2 = pytest.importorskip("jinja2")
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False,
                                                             indent=indent)
    assert jinja2.__version__ and env.from_string(template).render(
        messages=messages, tools=tools, documents=None, add_generation_prompt=False,
        enable_thinking=False) == rendered


def _hf_continue_final_message(rendered: str, final: str) -> str:
    """transformers' continue_final_message cut, as its render_jinja_template does it."""
    loc = rendered.rindex(final.strip())
    if rendered[loc: loc + len(final.lstrip())] == final:
        return rendered[: loc + len(final.lstrip())]
    return rendered[: loc + len(final.strip())]


@pytest.mark.parametrize("final", ["Sure, the answer", "  It is 4.  ", "x\n"])
def test_continue_final_message(model: llminfer.Model, final: str) -> None:
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": final}]
    full = model.apply_chat_template(messages, add_generation_prompt=False)
    cut = model.apply_chat_template(messages, add_generation_prompt=False,
                                    continue_final_message=True)
    assert cut == _hf_continue_final_message(full, final)
    assert cut.rstrip().endswith(final.strip()) and len(cut) < len(full)
    with pytest.raises(llminfer.InvalidArgumentError):
        model.apply_chat_template(messages, continue_final_message=True)


def test_chat_template_errors(model: llminfer.Model) -> None:
    with pytest.raises(llminfer.InvalidArgumentError) as caught:
        model.apply_chat_template([("user", "Hi")],
                                  chat_template="{{ raise_exception('no tools here') }}")
    assert "no tools here" in str(caught.value)
    with pytest.raises(llminfer.InvalidArgumentError) as caught:
        model.apply_chat_template([("user", "Hi")], chat_template="{% for %}")
    assert "line 1:" in str(caught.value)
    with pytest.raises(llminfer.LimitError):
        model.apply_chat_template(
            [("user", "Hi")],
            chat_template="{% for a in range(2000000) %}{{ a }}{% endfor %}")


def test_close_twice_and_use_after_close() -> None:
    loaded = llminfer.Model(model_path())
    session = llminfer.Session(loaded, n_threads=1, n_ctx=64)
    loaded.close()
    assert loaded.closed and session.closed  # the model closed its session first
    loaded.close()
    session.close()
    with pytest.raises(llminfer.ClosedError) as caught:
        loaded.tokenize("hello")
    assert caught.value.status_name == "LLM_ERR_INVALID_ARGUMENT"
    with pytest.raises(llminfer.ClosedError):
        session.generate([1, 2, 3], max_new_tokens=1)
    with pytest.raises(llminfer.ClosedError):
        llminfer.Session(loaded)


def test_garbage_collection_in_any_order() -> None:
    import gc

    loaded = llminfer.Model(model_path())
    session = llminfer.Session(loaded, n_threads=1, n_ctx=64)
    loaded.cycle = session  # type: ignore[attr-defined]
    del loaded, session
    gc.collect()
