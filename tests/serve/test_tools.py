"""Tool calling through llm-serve with the official openai client.

Run against a server with SmolLM2's own template (no tools section: the
fallback preamble), and again with TOOLS_TEMPLATE set to the
--chat-template file the server was given (a tools section in the Hermes or
the Llama 3 style): then the prompt the server builds is checked against
the same template rendered by Python's jinja2 as transformers does."""
import json
import os

import jinja2
import jsonschema
import openai

from common import API_KEY, BASE_URL, Suite, post_json

client = openai.OpenAI(base_url=BASE_URL + "/v1", api_key=API_KEY or "none", max_retries=0)
MODEL_ID = client.models.list().data[0].id
TEMPLATE = os.environ.get("TOOLS_TEMPLATE")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time now in a time zone.",
    "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "maxLength": 20}}, "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "system", "content": "You are a helpful assistant."},
       {"role": "user", "content": "What is the weather like in Paris today?"}]


def chat(**kw):
    kw.setdefault("model", MODEL_ID)
    kw.setdefault("messages", ASK)
    kw.setdefault("max_tokens", 150)
    return client.chat.completions.create(**kw)


def check_calls(calls, allowed):
    assert calls, calls
    ids = set()
    for call in calls:
        assert call.type == "function" and call.function.name in allowed, call
        assert call.id.startswith("call_") and len(call.id) == 29 and call.id[5:].isalnum(), call.id
        ids.add(call.id)
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert len(ids) == len(calls)


def stream_calls(**kw):
    """Reassembles streamed tool calls as OpenAI's clients do: by index,
    the first delta with id and name, arguments appended."""
    calls, content, finish = {}, "", None
    for chunk in chat(stream=True, **kw):
        for c in chunk.choices:
            content += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = d.id or call["id"]
                if d.function:
                    call["name"] = d.function.name or call["name"]
                    call["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    return [calls[i] for i in sorted(calls)], content, finish


def test_required():
    for parallel in (True, False):
        r = chat(tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel, temperature=0)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.content is None, c
        check_calls(c.message.tool_calls, {"get_weather", "get_time"})
        if not parallel:
            assert len(c.message.tool_calls) == 1, c


def test_named():
    for name in ("get_time", "get_weather"):
        r = chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": name}},
                 temperature=1.0, seed=4, parallel_tool_calls=False)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        check_calls(c.message.tool_calls, {name})
        assert len(c.message.tool_calls) == 1


def test_required_stream():
    calls, content, finish = stream_calls(tools=TOOLS, tool_choice="required", temperature=0)
    assert finish == "tool_calls" and content == "", (finish, content)
    whole = chat(tools=TOOLS, tool_choice="required", temperature=0).choices[0].message.tool_calls
    assert [(c["name"], c["arguments"]) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in whole]
    for c in calls:
        assert c["id"].startswith("call_")
        jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])


def test_stream_helper_reassembles():
    stream_api = getattr(client.chat.completions, "stream", None) or \
        client.beta.chat.completions.stream
    with stream_api(model=MODEL_ID, messages=ASK, tools=TOOLS, max_tokens=150,
                    tool_choice={"type": "function", "function": {"name": "get_weather"}}) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    check_calls(final.choices[0].message.tool_calls, {"get_weather"})


def test_auto_stream_equals_non_stream():
    """tool_choice auto: the stream (text as it comes, calls at the end)
    says what the whole answer says, whatever the model chose."""
    # (With the Hermes template the first makes SmolLM2 quote the call format:
    # text held back at "<tool_call>", then sent as content at the end.)
    for question in ("Call get_weather for Paris.", "What is the weather like in Paris today?",
                     "Say hello to me."):
        msgs = [ASK[0], {"role": "user", "content": question}]
        whole = chat(messages=msgs, tools=TOOLS, temperature=0, max_tokens=60).choices[0]
        calls, content, finish = stream_calls(messages=msgs, tools=TOOLS, temperature=0,
                                              max_tokens=60)
        assert content == (whole.message.content or ""), (content, whole.message.content)
        assert [(c["name"], c["arguments"]) for c in calls] == \
            [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
        assert finish == whole.finish_reason, (finish, whole.finish_reason)


def round_trip(stream, tool_choice):
    """A call (streamed or not), its result sent back, a final answer."""
    kw = dict(tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=False, temperature=0)
    if stream:
        calls, _, finish = stream_calls(**kw)
        assert finish == "tool_calls" and len(calls) == 1, (finish, calls)
        call = {"id": calls[0]["id"], "name": calls[0]["name"], "arguments": calls[0]["arguments"]}
    else:
        c = chat(**kw).choices[0]
        assert c.finish_reason == "tool_calls", c
        check_calls(c.message.tool_calls, {"get_weather", "get_time"})
        t = c.message.tool_calls[0]
        call = {"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
    jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
    if isinstance(tool_choice, dict):
        assert call["name"] == tool_choice["function"]["name"], call
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function",
             "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(
            {"temperature": 21, "sky": "sunny"})}]
    # "none": tools offered no more, the model answers in words.
    if stream:
        calls, content, finish = stream_calls(messages=messages, tools=TOOLS, tool_choice="none",
                                              temperature=0, max_tokens=40)
        assert not calls and content.strip() and finish in ("stop", "length"), (calls, content)
    else:
        r = chat(messages=messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=40)
        assert r.choices[0].message.content.strip() and not r.choices[0].message.tool_calls, r
        assert r.choices[0].finish_reason in ("stop", "length")
    # "auto": whatever the model chooses, the reply is well-formed.
    r = chat(messages=messages, tools=TOOLS, temperature=0, max_tokens=60)
    c = r.choices[0]
    if c.message.tool_calls:
        assert c.finish_reason == "tool_calls"
        check_calls(c.message.tool_calls, {"get_weather", "get_time"})
    else:
        assert isinstance(c.message.content, str) and c.finish_reason in ("stop", "length"), c
    return messages


NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_round_trip():
    round_trip(False, "required")
    round_trip(False, NAMED)


def test_round_trip_stream():
    round_trip(True, "required")
    round_trip(True, NAMED)


def prompt_tokens(**kw):
    return chat(max_tokens=1, temperature=0, **kw).usage.prompt_tokens


def tokenize(text):
    status, _, body = post_json("/tokenize", {"prompt": text, "add_special": True})
    assert status == 200, body
    return body["tokens"]


def render_reference(messages, tools):
    """The template as transformers renders it (jinja2, its tojson), with
    the request's messages as the server hands them over: content as a
    string, tool-call arguments as the objects they encode."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True,
                             extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    with open(TEMPLATE) as f:
        template = env.from_string(f.read())
    msgs = []
    for m in messages:
        m = dict(m)
        m["content"] = m.get("content") or ""
        if m.get("tool_calls"):
            m["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.loads(
                c["function"]["arguments"]))) for c in m["tool_calls"]]
        msgs.append(m)
    return template.render(messages=msgs, tools=tools, add_generation_prompt=True,
                           bos_token="", eos_token="")


def test_tools_reach_the_template():
    plain = prompt_tokens()
    with_tools = prompt_tokens(tools=TOOLS)
    assert with_tools > plain + 40, (plain, with_tools)
    assert prompt_tokens(tools=TOOLS, tool_choice="none") == plain
    if not TEMPLATE:
        return
    messages = round_trip(False, NAMED)
    for msgs, tools in ((ASK, TOOLS), (messages, TOOLS), (messages, None)):
        want = len(tokenize(render_reference(msgs, tools)))
        got = prompt_tokens(messages=msgs, **({"tools": tools} if tools else {}))
        assert got == want, (got, want, render_reference(msgs, tools))


def bad(body, param, *message_parts):
    body = dict(body)
    body.setdefault("messages", ASK)
    status, _, r = post_json("/v1/chat/completions", body)
    assert status == 400, (status, r)
    err = r["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, (err, param)
    for part in message_parts:
        assert part in err["message"], (part, err["message"])


def test_bad_requests():
    bad({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0]",
        "'tools[0].function.name' is required")
    bad({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0]")
    bad({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "array"}}}]}, "tools[0]", "parameters")
    bad({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
        "tools[0]", "parameters")
    bad({"tools": [WEATHER, WEATHER]}, "tools[1]", "a second function named 'get_weather'")
    bad({"tools": [{"type": "retrieval"}]}, "tools[0]", "'function'")
    bad({"tools": {"a": 1}}, "tools")
    bad({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice", "'nope'", "not in 'tools'")
    bad({"tool_choice": "required"}, "tool_choice", "needs 'tools'")
    bad({"tool_choice": "auto"}, "tool_choice", "needs 'tools'")
    bad({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice")
    bad({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls")
    bad({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
        "tool_choice", "cannot be combined")
    # a parameters schema the grammar compiler refuses: keyword and pointer
    bad({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}}}}],
        "tool_choice": "required"}, "tools[0]", "'tools[0].function.parameters'", "multipleOf",
        "at /properties/n/multipleOf")
    bad({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages",
        "only assistant messages")
    bad({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
        "messages[0].tool_calls")
    bad({"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]}, "messages",
        "tool_call_id")


if __name__ == "__main__":
    Suite("tools" + (" (template)" if TEMPLATE else " (fallback)")).run([
        test_required, test_named, test_required_stream, test_stream_helper_reassembles,
        test_auto_stream_equals_non_stream,
        test_round_trip, test_round_trip_stream, test_tools_reach_the_template, test_bad_requests,
    ])
