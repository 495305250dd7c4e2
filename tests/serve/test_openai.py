"""The official OpenAI Python client against llm-serve."""
import openai

from common import API_KEY, BASE_URL, Suite, llm_run_greedy, post_json

client = openai.OpenAI(base_url=BASE_URL + "/v1", api_key=API_KEY or "none", max_retries=0)
MODEL_ID = client.models.list().data[0].id
QUESTION = "What is the capital of France?"


def chat(**kw):
    kw.setdefault("model", MODEL_ID)
    kw.setdefault("messages", [{"role": "user", "content": QUESTION}])
    return client.chat.completions.create(**kw)


def test_models():
    models = client.models.list().data
    assert len(models) == 1 and models[0].object == "model", models


def test_chat_greedy_matches_llm_run():
    for prompt, n in [(QUESTION, 24), ("Write a haiku about the sea.", 32)]:
        want, want_tokens = llm_run_greedy(prompt, n)
        r = chat(messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=n)
        got = r.choices[0].message.content
        assert got == want, (got, want)
        assert r.usage.completion_tokens == want_tokens, (r.usage, want_tokens)
        assert r.choices[0].finish_reason in ("stop", "length")
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_greedy_matches_llm_run():
    want, want_tokens = llm_run_greedy("Once upon a time", 16, chat=False)
    r = client.completions.create(model=MODEL_ID, prompt="Once upon a time", temperature=0,
                                  max_tokens=16)
    assert r.choices[0].text == want, (r.choices[0].text, want)
    assert r.usage.completion_tokens == want_tokens
    assert r.choices[0].finish_reason == "length"


def test_chat_stream_equals_non_stream():
    full = chat(temperature=0, max_tokens=20).choices[0].message.content
    stream = chat(temperature=0, max_tokens=20, stream=True, stream_options={"include_usage": True})
    parts, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    assert "".join(parts) == full, ("".join(parts), full)
    assert usage and usage.completion_tokens > 0 and finish


def test_completion_stream():
    full = client.completions.create(model=MODEL_ID, prompt="The sky is", temperature=0,
                                     max_tokens=12).choices[0].text
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL_ID, prompt="The sky is", temperature=0, max_tokens=12, stream=True)
        if c.choices)
    assert text == full, (text, full)


def test_content_parts_and_system():
    r1 = chat(temperature=0, max_tokens=8, messages=[
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "What is the capital "},
                                     {"type": "text", "text": "of France?"}]}])
    r2 = chat(temperature=0, max_tokens=8, messages=[
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": QUESTION}])
    assert r1.choices[0].message.content == r2.choices[0].message.content


def test_n_samples():
    r = chat(n=3, temperature=1.0, seed=7, max_tokens=12)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1, "three samples all equal"
    stream = chat(n=2, temperature=1.0, seed=7, max_tokens=12, stream=True)
    texts = {0: "", 1: ""}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts[0] == r.choices[0].message.content, (texts, r.choices[0].message.content)
    assert texts[1] == r.choices[1].message.content


def test_seed_reproducible():
    a = chat(temperature=1.0, seed=1234, max_tokens=24).choices[0].message.content
    b = chat(temperature=1.0, seed=1234, max_tokens=24).choices[0].message.content
    c = chat(temperature=1.0, seed=99, max_tokens=24).choices[0].message.content
    assert a == b, (a, b)
    assert a != c, "different seeds gave the same text"


def test_stop_strings():
    full = chat(temperature=0, max_tokens=24).choices[0].message.content
    words = full.split(" ")
    assert len(words) > 3, full
    stop = " " + words[2]
    r = chat(temperature=0, max_tokens=24, stop=[stop, "zzzz"])
    text = r.choices[0].message.content
    assert text == full[:full.index(stop)], (text, full, stop)
    assert r.choices[0].finish_reason == "stop"
    r = client.completions.create(model=MODEL_ID, prompt="1, 2, 3, 4,", temperature=0,
                                  max_tokens=20, stop=" 7")
    assert "7" not in r.choices[0].text and r.choices[0].finish_reason == "stop", r.choices[0]


def test_chat_logprobs():
    r = chat(temperature=0, max_tokens=8, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token


def test_completion_logprobs():
    r = client.completions.create(model=MODEL_ID, prompt="The sky is", temperature=0,
                                  max_tokens=6, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 6 and len(lp.token_logprobs) == 6 and len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0 and all(len(t) <= 2 for t in lp.top_logprobs)


def stops_cut_from(tokens):
    """Stop strings cut from a greedy answer, given as its token texts, past
    its first third, each spanning two tokens and first found where it was
    cut: one starts where a token starts, one a character into a token.
    Returns (stop, the token texts whose text is returned, the number of
    tokens generated up to the one that completes the stop) for each."""
    text = "".join(tokens)
    found = {}
    for k in range(len(tokens) // 3, len(tokens) - 1):
        before = len("".join(tokens[:k]))
        pair = tokens[k] + tokens[k + 1]
        if not pair.isascii():
            continue
        if "at_token" not in found and text.find(pair) == before:
            found["at_token"] = (pair, tokens[:k], k + 2)
        if "inside_token" not in found and len(tokens[k]) > 1 and text.find(pair[1:]) == before + 1:
            found["inside_token"] = (pair[1:], tokens[:k + 1], k + 2)
    assert len(found) == 2, ("no stop strings to cut from", tokens)
    return [found["at_token"], found["inside_token"]]


def check_tokens_cover(text, tokens, what):
    """The token texts cover exactly `text`: the last one may go past its
    end (it straddles a stop string), but every one starts inside it."""
    joined = "".join(tokens)
    assert joined.startswith(text), (what, text, tokens)
    assert not tokens or len(joined) - len(tokens[-1]) < len(text), (what, text, tokens)


def check_text_offsets(text, tokens, offsets, what):
    assert len(offsets) == len(tokens), (what, offsets, tokens)
    for token, offset in zip(tokens, offsets):
        assert text[offset:offset + len(token)] == token[:len(text) - offset], \
            (what, text, token, offset)


STOP_TEST_TOKENS = 24


def test_chat_logprobs_end_at_stop_string():
    greedy = chat(temperature=0, max_tokens=STOP_TEST_TOKENS, logprobs=True)
    full = greedy.choices[0].message.content
    for stop, kept, generated in stops_cut_from([t.token for t in greedy.choices[0].logprobs.content]):
        want_text = full[:full.index(stop)]
        r = chat(temperature=0, max_tokens=STOP_TEST_TOKENS, logprobs=True, top_logprobs=2,
                 stop=[stop, "zzzz"])
        text = r.choices[0].message.content
        tokens = [t.token for t in r.choices[0].logprobs.content]
        assert text == want_text and r.choices[0].finish_reason == "stop", (stop, text)
        assert tokens == kept, (stop, text, tokens, kept)
        check_tokens_cover(text, tokens, stop)
        # As vLLM counts: the stop string's tokens are generated, so counted.
        assert r.usage.completion_tokens == generated, (stop, r.usage, generated)

        stream = chat(temperature=0, max_tokens=STOP_TEST_TOKENS, logprobs=True, top_logprobs=2,
                      stop=[stop, "zzzz"], stream=True, stream_options={"include_usage": True})
        text, tokens, usage = "", [], None
        for chunk in stream:
            usage = chunk.usage or usage
            for c in chunk.choices:
                text += c.delta.content or ""
                tokens += [t.token for t in (c.logprobs.content if c.logprobs else None) or []]
                # Held-back text and its tokens' logprobs are sent together.
                check_tokens_cover(text, tokens, (stop, "streamed so far"))
        assert text == want_text and tokens == kept, (stop, text, tokens, kept)
        assert usage.completion_tokens == generated, (stop, usage, generated)


def test_chat_stream_logprobs_wait_for_held_text():
    greedy = chat(temperature=0, max_tokens=STOP_TEST_TOKENS, logprobs=True)
    full = greedy.choices[0].message.content
    all_tokens = [t.token for t in greedy.choices[0].logprobs.content]
    stop, _, _ = stops_cut_from(all_tokens)[0]
    # Matches for two tokens, then fails: their text is held, then sent.
    stream = chat(temperature=0, max_tokens=STOP_TEST_TOKENS, logprobs=True, stream=True,
                  stop=stop + "\x01")
    text, tokens = "", []
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            tokens += [t.token for t in (c.logprobs.content if c.logprobs else None) or []]
            check_tokens_cover(text, tokens, "streamed so far")
    assert text == full and tokens == all_tokens, (text, tokens)


def test_completion_logprobs_end_at_stop_string():
    prompt = "Once upon a time"
    greedy = client.completions.create(model=MODEL_ID, prompt=prompt, temperature=0,
                                       max_tokens=STOP_TEST_TOKENS, logprobs=0)
    full = greedy.choices[0].text
    stops = stops_cut_from(greedy.choices[0].logprobs.tokens)
    # One more that matches for two tokens, then fails: all the text is sent.
    stops.append((stops[0][0] + "\x01", greedy.choices[0].logprobs.tokens,
                  greedy.usage.completion_tokens))
    for stop, kept, generated in stops:
        want_text = full[:full.index(stop)] if stop in full else full
        r = client.completions.create(model=MODEL_ID, prompt=prompt, temperature=0,
                                      max_tokens=STOP_TEST_TOKENS, logprobs=1, stop=stop)
        text, lp = r.choices[0].text, r.choices[0].logprobs
        assert text == want_text, (stop, text)
        assert lp.tokens == kept, (stop, text, lp.tokens, kept)
        assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(kept), (stop, lp)
        check_tokens_cover(text, lp.tokens, stop)
        check_text_offsets(text, lp.tokens, lp.text_offset, stop)
        assert r.usage.completion_tokens == generated, (stop, r.usage, generated)

        stream = client.completions.create(
            model=MODEL_ID, prompt=prompt, temperature=0, max_tokens=STOP_TEST_TOKENS,
            logprobs=1, stop=stop, stream=True, stream_options={"include_usage": True})
        text, tokens, offsets, usage = "", [], [], None
        for chunk in stream:
            usage = chunk.usage or usage
            for c in chunk.choices:
                text += c.text
                if c.logprobs:
                    tokens += c.logprobs.tokens
                    offsets += c.logprobs.text_offset
                    assert len(c.logprobs.token_logprobs) == len(c.logprobs.tokens)
                check_tokens_cover(text, tokens, (stop, "streamed so far"))
        assert text == want_text and tokens == kept, (stop, text, tokens, kept)
        check_text_offsets(text, tokens, offsets, (stop, "streamed"))
        assert usage.completion_tokens == generated, (stop, usage, generated)


def test_completion_text_offset_counts_characters():
    # The answer has multi-byte characters ("française"); offsets index the
    # returned text as the client sees it, the echoed prompt included.
    prompt = "The capital of France is Paris. En français, Paris est"
    for echo in (False, True):
        r = client.completions.create(model=MODEL_ID, prompt=prompt, temperature=0,
                                      max_tokens=12, logprobs=0, echo=echo)
        text, lp = r.choices[0].text, r.choices[0].logprobs
        start = len(prompt) if echo else 0
        assert lp.text_offset[0] == start, (echo, lp.text_offset)
        check_text_offsets(text, lp.tokens, lp.text_offset, echo)
        check_tokens_cover(text[start:], lp.tokens, echo)


def test_penalties_accepted():
    r = chat(temperature=0, max_tokens=8, presence_penalty=0.5, frequency_penalty=0.5,
             extra_body={"top_k": 20, "min_p": 0.05, "repeat_penalty": 1.1, "repeat_last_n": 32})
    assert r.choices[0].message.content and r.usage.completion_tokens > 0


def tokenize(text, add_special=True):
    status, _, body = post_json("/tokenize", {"prompt": text, "add_special": add_special})
    assert status == 200, body
    return body["tokens"]


def test_logit_bias():
    # A large bias on one token makes greedy decoding pick it every time.
    r = chat(temperature=0, max_tokens=3, logprobs=True, logit_bias={"1000": 100})
    tokens = [t.token for t in r.choices[0].logprobs.content]
    assert len(tokens) == 3 and len(set(tokens)) == 1, tokens
    # -100 bans a token: the greedy first token is replaced by another.
    first = chat(temperature=0, max_tokens=1, logprobs=True).choices[0].logprobs.content[0].token
    ids = tokenize(first, add_special=False)
    assert len(ids) == 1, (first, ids)
    r = chat(temperature=0, max_tokens=1, logprobs=True, logit_bias={str(ids[0]): -100})
    assert r.choices[0].logprobs.content[0].token != first


def test_prompt_as_token_ids():
    ids = tokenize("The sky is")
    status, _, back = post_json("/detokenize", {"tokens": ids})
    assert status == 200 and back["prompt"].endswith("The sky is"), back
    by_text = client.completions.create(model=MODEL_ID, prompt="The sky is", temperature=0,
                                        max_tokens=6)
    by_ids = client.completions.create(model=MODEL_ID, prompt=ids, temperature=0, max_tokens=6)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids) == by_text.usage.prompt_tokens


def test_max_completion_tokens_and_length():
    r = chat(temperature=0, max_completion_tokens=3)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_speculative_same_answer():
    plain = chat(temperature=0, max_tokens=24).choices[0].message.content
    for mode in ("ngram", "draft"):  # run.sh gives the server a draft model
        spec = chat(temperature=0, max_tokens=24, extra_body={"speculative": mode})
        assert spec.choices[0].message.content == plain, mode


def test_completion_echo():
    r = client.completions.create(model=MODEL_ID, prompt="The sky is", temperature=0,
                                  max_tokens=4, echo=True)
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL_ID, prompt="The sky is", temperature=0, max_tokens=4, echo=True, stream=True)
        if c.choices)
    assert r.choices[0].text.startswith("The sky is") and text == r.choices[0].text, (text, r)


if __name__ == "__main__":
    Suite("openai").run([
        test_models, test_chat_greedy_matches_llm_run, test_completion_greedy_matches_llm_run,
        test_chat_stream_equals_non_stream, test_completion_stream, test_content_parts_and_system,
        test_n_samples, test_seed_reproducible, test_stop_strings, test_chat_logprobs,
        test_completion_logprobs, test_chat_logprobs_end_at_stop_string,
        test_chat_stream_logprobs_wait_for_held_text, test_completion_logprobs_end_at_stop_string,
        test_completion_text_offset_counts_characters, test_penalties_accepted, test_logit_bias, test_prompt_as_token_ids,
        test_max_completion_tokens_and_length, test_speculative_same_answer, test_completion_echo,
    ])
