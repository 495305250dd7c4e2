"""Structured output through llm-serve with the official openai client:
response_format (json_object, json_schema, Pydantic models through
chat.completions.parse), the other servers' fields (grammar, json_schema,
guided_json, guided_regex, guided_grammar), streaming and not; every output
is checked with jsonschema (or re) against what was asked, and bad requests
get 400 with OpenAI's error shape."""
import json
import re
from typing import List, Literal, Optional

import jsonschema
import openai
import pydantic

from common import API_KEY, BASE_URL, Suite, metrics, post_json

client = openai.OpenAI(base_url=BASE_URL + "/v1", api_key=API_KEY or "none", max_retries=0)
MODEL_ID = client.models.list().data[0].id
ASK = [{"role": "user", "content": "Describe a person from Paris as JSON."}]

# Strings and arrays are bounded so that a small model always finishes.
NAME = {"type": "string", "minLength": 1, "maxLength": 24}
SCHEMAS = {
    "flat": {"type": "object", "properties": {"name": NAME, "age": {"type": "integer"}},
             "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "person": {"type": "object", "properties": {"name": NAME, "city": NAME},
                   "required": ["name", "city"], "additionalProperties": False},
        "score": {"type": "number"}}, "required": ["person", "score"],
        "additionalProperties": False},
    "enum": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "size": {"enum": [1, 2, 3]}},
        "required": ["color", "size"], "additionalProperties": False},
    "array": {"type": "object", "properties": {
        "tags": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}},
        "required": ["tags"], "additionalProperties": False},
    "anyOf": {"type": "object", "properties": {
        "value": {"anyOf": [{"type": "integer"}, {"type": "boolean"}, {"type": "null"}]}},
        "required": ["value"], "additionalProperties": False},
    "ref": {"type": "object", "$defs": {"city": {"type": "object", "properties": {
        "name": NAME, "country": NAME}, "required": ["name", "country"],
        "additionalProperties": False}},
        "properties": {"home": {"$ref": "#/$defs/city"}, "work": {"$ref": "#/$defs/city"}},
        "required": ["home", "work"], "additionalProperties": False},
    "const_bool": {"type": "object", "properties": {
        "kind": {"const": "person"}, "alive": {"type": "boolean"}},
        "required": ["kind", "alive"], "additionalProperties": False},
    "pattern": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["code"], "additionalProperties": False},
    "format": {"type": "object", "properties": {
        "born": {"type": "string", "format": "date"}, "id": {"type": "string", "format": "uuid"}},
        "required": ["born", "id"], "additionalProperties": False},
    "array_of_objects": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
        "type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"], "additionalProperties": False}},
    "optional": {"type": "object", "properties": {"a": {"type": "integer"}, "b": NAME},
                 "required": ["a"], "additionalProperties": False},
}


def chat(**kw):
    kw.setdefault("model", MODEL_ID)
    kw.setdefault("messages", ASK)
    kw.setdefault("max_tokens", 200)
    return client.chat.completions.create(**kw)


def check(text, schema, what):
    value = json.loads(text)
    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
    return value


def response_format(name, schema):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def test_json_schema_each_schema():
    for name, schema in SCHEMAS.items():
        for temperature in (0, 1.0):
            r = chat(response_format=response_format(name, schema), temperature=temperature, seed=5)
            c = r.choices[0]
            assert c.finish_reason == "stop", (name, c)
            check(c.message.content, schema, name)


def test_json_schema_stream():
    for name in ("nested", "ref", "array_of_objects"):
        parts, finish = [], None
        for chunk in chat(response_format=response_format(name, SCHEMAS[name]), stream=True,
                          temperature=0.7, seed=3):
            for c in chunk.choices:
                parts.append(c.delta.content or "")
                finish = c.finish_reason or finish
        assert finish == "stop", finish
        check("".join(parts), SCHEMAS[name], name)


def test_completions_response_format():
    schema = SCHEMAS["enum"]
    r = client.completions.create(model=MODEL_ID, prompt="A color and a size:", max_tokens=60,
                                  extra_body={"response_format": response_format("e", schema)})
    check(r.choices[0].text, schema, "completions")
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL_ID, prompt="A color and a size:", max_tokens=60, stream=True,
        extra_body={"response_format": response_format("e", schema)}) if c.choices)
    check(text, schema, "completions stream")


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    age: int
    role: Literal["engineer", "artist", "doctor"]
    home: City
    nicknames: List[str] = pydantic.Field(max_length=2)
    email: Optional[str] = pydantic.Field(max_length=30)


def parse_api():
    return getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse


def stream_api():
    return getattr(client.chat.completions, "stream", None) or client.beta.chat.completions.stream


def test_pydantic_parse():
    for seed in (1, 2):
        r = parse_api()(model=MODEL_ID, messages=ASK, response_format=Person, max_tokens=300,
                        temperature=1.0, seed=seed)
        person = r.choices[0].message.parsed
        assert isinstance(person, Person), r
        Person.model_validate_json(r.choices[0].message.content)


def test_pydantic_parse_stream():
    with stream_api()(model=MODEL_ID, messages=ASK, response_format=Person, max_tokens=300,
                      temperature=0) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Person), final


def test_json_object():
    for stream in (False, True):
        # Any object may run on for ever; these settings end within the limit.
        r = chat(response_format={"type": "json_object"}, temperature=0.3, seed=11, stream=stream)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in r if c.choices)
        else:
            assert r.choices[0].finish_reason == "stop", r
            text = r.choices[0].message.content
        assert isinstance(json.loads(text), dict), text


def test_response_format_text_is_free():
    a = chat(response_format={"type": "text"}, temperature=0, max_tokens=16)
    b = chat(temperature=0, max_tokens=16)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_extension_fields():
    schema = SCHEMAS["flat"]
    for field in ("json_schema", "guided_json"):
        for value in (schema, json.dumps(schema)):
            r = chat(extra_body={field: value}, temperature=0.5, seed=2)
            check(r.choices[0].message.content, schema, field)
    r = chat(extra_body={"guided_regex": "[A-Z][a-z]{2,8} (is|was) [0-9]{1,2}"}, temperature=1.0)
    assert re.fullmatch("[A-Z][a-z]{2,8} (is|was) [0-9]{1,2}", r.choices[0].message.content), r
    gbnf = 'root ::= "The answer is " ("yes" | "no") "."'
    for field in ("grammar", "guided_grammar"):
        r = chat(extra_body={field: gbnf}, temperature=1.0)
        assert r.choices[0].message.content in ("The answer is yes.", "The answer is no."), r
    r = client.completions.create(model=MODEL_ID, prompt="Answer:", max_tokens=20,
                                  extra_body={"grammar": gbnf})
    assert r.choices[0].text in ("The answer is yes.", "The answer is no."), r


def test_grammars_are_cached():
    """A schema is compiled on its first request and served from the cache
    after (/metrics counts both); two schemas that differ in one enum value
    are two grammars."""
    a = {"type": "object", "properties": {"x": {"enum": ["left"]}}, "required": ["x"]}
    b = {"type": "object", "properties": {"x": {"enum": ["right"]}}, "required": ["x"]}
    counts = []
    for schema in (a, b, a, b):
        before = metrics()
        r = chat(response_format=response_format("x", schema), max_tokens=20)
        after = metrics()
        counts.append((after["llm_serve_grammar_compiles_total"] -
                       before["llm_serve_grammar_compiles_total"],
                       after["llm_serve_grammar_cache_hits_total"] -
                       before["llm_serve_grammar_cache_hits_total"]))
        check(r.choices[0].message.content, schema, "cache")
        assert json.loads(r.choices[0].message.content) == {"x": schema["properties"]["x"]["enum"][0]}
    assert counts == [(1, 0), (1, 0), (0, 1), (0, 1)], counts
    assert 1 <= metrics()["llm_serve_grammar_cache_entries"] <= 64


def test_grammar_cache_under_load():
    """More distinct schemas than the cache holds (64), from 8 threads at
    once, each twice: every answer follows its own schema, through
    compiles racing for the same text and evictions of grammars in use."""
    import concurrent.futures

    def one(i):
        schema = {"type": "object", "properties": {"v": {"const": f"value-{i}"}},
                  "required": ["v"], "additionalProperties": False}
        r = chat(response_format=response_format(f"s{i}", schema), max_tokens=20)
        return json.loads(r.choices[0].message.content) == {"v": f"value-{i}"}

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, [i % 80 for i in range(160)]))
    assert all(results), results.count(False)


def bad(body, param, *message_parts, path="/v1/chat/completions"):
    body = dict(body)
    body.setdefault("messages" if "chat" in path else "prompt",
                    ASK if "chat" in path else "x")
    status, _, r = post_json(path, body)
    assert status == 400, (status, r)
    err = r["error"]
    assert err["type"] == "invalid_request_error" and "code" in err, r
    assert err["param"] == param, (err, param)
    for part in message_parts:
        assert part in err["message"], (part, err["message"])


def test_bad_requests():
    bad({"response_format": {"type": "xml"}}, "response_format.type", "'xml'")
    bad({"response_format": "json"}, "response_format", "must be an object")
    bad({"response_format": {"type": "json_schema"}}, "response_format.json_schema")
    bad({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
        "response_format.json_schema.schema")
    # an unsupported keyword: the compiler names it and its JSON pointer
    bad({"response_format": response_format("x", {"type": "object", "properties": {
        "n": {"type": "integer", "multipleOf": 3}}})},
        "response_format", "multipleOf", "/properties/n/multipleOf")
    bad({"response_format": response_format("x", {"type": "object", "properties": {
        "d": {"type": "string", "format": "ipv4"}}})}, "response_format", "ipv4", "/properties/d")
    bad({"response_format": response_format("x", {"$ref": "#/$defs/missing"})}, "response_format")
    bad({"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'}, "grammar",
        "both constrain the output")
    bad({"guided_json": {"type": "object"}, "guided_regex": "a+"}, "guided_regex",
        "'guided_json' and 'guided_regex'")
    bad({"guided_regex": "(a"}, "guided_regex", "unclosed")
    bad({"guided_regex": ""}, "guided_regex", "must not be empty")
    bad({"grammar": "root ::= ("}, "grammar", "1:")
    bad({"grammar": 5}, "grammar", "must be a string")
    bad({"guided_json": "{not json"}, "guided_json", "not valid JSON")
    bad({"response_format": {"type": "bogus"}}, "response_format.type", path="/v1/completions")


if __name__ == "__main__":
    Suite("structured").run([
        test_json_schema_each_schema, test_json_schema_stream, test_completions_response_format,
        test_pydantic_parse, test_pydantic_parse_stream, test_json_object,
        test_response_format_text_is_free, test_extension_fields, test_grammars_are_cached,
        test_grammar_cache_under_load,
        test_bad_requests,
    ])
