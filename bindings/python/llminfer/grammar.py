"""Structured output: grammars compiled for a model's vocabulary.

A :class:`Grammar` (from a JSON Schema, a GBNF grammar or a regular
expression) goes into :class:`SamplingParams` (``grammar=``) to constrain
``Session.generate``, requests and samplers; a :class:`GrammarState` follows
one sequence token by token for hosts that sample themselves.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any, List, Optional, Union

from . import _native
from ._closeable import Closeable
from ._native import lib
from .errors import ClosedError, check

WHITESPACE = {"compact": 0, "flexible": 1}


class Grammar(Closeable):
    """A compiled grammar; read-only, shareable by any number of requests.

    It must stay open while anything that uses it runs (requests, samplers,
    states). Compile errors raise the library's error with the place named
    (JSON pointer, line:column or offset)."""

    def __init__(self, model: Any, kind: str, text: str, whitespace: str = "compact",
                 root: Optional[str] = None) -> None:
        self._ptr: Optional[int] = None
        self._model = model  # the vocabulary it was compiled for
        params = _native.GrammarParams()
        lib.llm_grammar_params_init_sized(ctypes.byref(params), ctypes.sizeof(params))
        if whitespace not in WHITESPACE:
            raise ValueError(f"whitespace must be one of {sorted(WHITESPACE)}")
        params.whitespace = WHITESPACE[whitespace]
        root_bytes = root.encode() if root is not None else None
        params.root = root_bytes
        data = text.encode()
        fn = {"json_schema": lib.llm_grammar_compile_json_schema,
              "ebnf": lib.llm_grammar_compile_ebnf,
              "regex": lib.llm_grammar_compile_regex}[kind]
        out = _native.p_grammar()
        check(fn(model._handle(), data, len(data), ctypes.byref(params), ctypes.byref(out)))
        self._ptr = out.value

    @classmethod
    def from_json_schema(cls, model: Any, schema: Union[str, dict],
                         whitespace: str = "compact") -> "Grammar":
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return cls(model, "json_schema", text, whitespace=whitespace)

    @classmethod
    def from_ebnf(cls, model: Any, text: str, root: Optional[str] = None) -> "Grammar":
        return cls(model, "ebnf", text, root=root)

    @classmethod
    def from_regex(cls, model: Any, pattern: str) -> "Grammar":
        return cls(model, "regex", pattern)

    def _handle(self) -> int:
        if self._ptr is None:
            raise ClosedError("the grammar is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            lib.llm_grammar_free(ptr)

    def state(self) -> "GrammarState":
        return GrammarState(self)


class GrammarState(Closeable):
    """Where one sequence is in a grammar (one thread at a time)."""

    def __init__(self, grammar: Grammar, _ptr: Optional[int] = None) -> None:
        self._grammar = grammar
        self._ptr: Optional[int] = None
        if _ptr is None:
            out = _native.p_grammar_state()
            check(lib.llm_grammar_state_create(grammar._handle(), ctypes.byref(out)))
            _ptr = out.value
        self._ptr = _ptr

    def _handle(self) -> int:
        if self._ptr is None:
            raise ClosedError("the grammar state is closed")
        return self._ptr

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            lib.llm_grammar_state_free(ptr)

    def fork(self) -> "GrammarState":
        out = _native.p_grammar_state()
        check(lib.llm_grammar_state_fork(self._handle(), ctypes.byref(out)))
        return GrammarState(self._grammar, out.value)

    def accept(self, token: int) -> None:
        """Advances by one token; a token the grammar refuses raises and
        changes nothing."""
        check(lib.llm_grammar_state_accept_token(self._handle(), int(token)))

    def allowed_tokens(self) -> List[int]:
        """The token ids the grammar allows next."""
        n_vocab = self._grammar._model.info.n_vocab
        words = (n_vocab + 31) // 32
        mask = (ctypes.c_uint32 * words)()
        check(lib.llm_grammar_state_fill_mask(self._handle(), mask, words))
        return [w * 32 + b for w in range(words) if mask[w] for b in range(32)
                if (mask[w] >> b) & 1]

    def can_end(self) -> bool:
        out = ctypes.c_bool()
        check(lib.llm_grammar_state_can_end(self._handle(), ctypes.byref(out)))
        return bool(out.value)

    def is_complete(self) -> bool:
        out = ctypes.c_bool()
        check(lib.llm_grammar_state_is_complete(self._handle(), ctypes.byref(out)))
        return bool(out.value)

    def rollback(self, n_tokens: int) -> None:
        check(lib.llm_grammar_state_rollback(self._handle(), int(n_tokens)))
