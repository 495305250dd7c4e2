"""Models: loading, facts, tokenizer and chat template."""

from __future__ import annotations

import ctypes
import enum
import json
import os
import threading
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple,
                    Union)

from . import _native
from ._buffers import read_text
from ._closeable import Closeable
from ._native import lib
from .errors import ClosedError, Status, check, error_for

if TYPE_CHECKING:
    from ._handles import _SessionHandle

_ERROR_CAPACITY = 1024

ChatMessage = Union[Mapping[str, Any], Tuple[str, str]]
"""A chat message: ``{"role": ..., "content": ..., ...}`` (OpenAI-shaped:
content may be a list of parts, and tool_calls, tool_call_id, name,
reasoning_content are passed on) or ``(role, content)``."""


class TokenizeFlag(enum.IntFlag):
    ADD_SPECIAL = 1 << 0
    PARSE_SPECIAL = 1 << 1
    STRICT = 1 << 2


@dataclass(frozen=True)
class ModelInfo:
    """``llm_model_info``: facts about a loaded model."""

    architecture: str
    name: str
    n_params: int
    weight_bytes: int
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    bos: Optional[int]
    eos: Optional[int]
    eot: Optional[int]
    pad: Optional[int]
    has_chat_template: bool


def _token_or_none(token: int) -> Optional[int]:
    return None if token == -1 else token


def _as_path_bytes(path: Union[str, "os.PathLike[str]"]) -> bytes:
    return os.fsencode(os.fspath(path))


class Model(Closeable):
    """A loaded GGUF model; immutable and shareable between threads.

    ``Model(path, use_mmap=True)`` loads it. Close it with :meth:`close` or a
    ``with`` block; sessions still open on it are closed first, so the
    library never sees a model freed under a session.
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], *, use_mmap: Optional[bool] = None):
        self._ptr: Optional[int] = None
        self._lock = threading.Lock()
        # Native session handles (not the Session objects): the model frees
        # them before itself even when the garbage collector finalizes both
        # in one cycle, in whatever order.
        self._sessions: Dict[int, "_SessionHandle"] = {}
        self.path = os.fspath(path)

        params = _native.ModelParams()
        lib.llm_model_params_init_sized(ctypes.byref(params), ctypes.sizeof(params))
        if use_mmap is not None:
            params.use_mmap = bool(use_mmap)
        message = ctypes.create_string_buffer(_ERROR_CAPACITY)
        params.error_message = ctypes.cast(message, ctypes.POINTER(ctypes.c_char))
        params.error_capacity = _ERROR_CAPACITY
        out = _native.p_model()
        status = lib.llm_model_load(_as_path_bytes(path), ctypes.byref(params), ctypes.byref(out))
        check(status, lambda: message.value.decode("utf-8", "replace"))
        self._ptr = out.value
        self._info = self._read_info()

    # --- lifetime ---------------------------------------------------------

    def close(self) -> None:
        """Frees the model, after closing every session still open on it."""
        with self._lock:
            ptr, self._ptr = self._ptr, None
            sessions = list(self._sessions.values())
            self._sessions.clear()
        if ptr is None:
            return
        for handle in sessions:
            handle.free()
        lib.llm_model_free(ptr)

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def _handle(self) -> int:
        ptr = self._ptr
        if ptr is None:
            raise ClosedError("model")
        return ptr

    def _attach(self, handle: "_SessionHandle") -> None:
        with self._lock:
            if self._ptr is None:
                raise ClosedError("model")
            self._sessions[id(handle)] = handle

    def _detach(self, handle: "_SessionHandle") -> None:
        with self._lock:
            self._sessions.pop(id(handle), None)

    # --- facts -------------------------------------------------------------

    def _read_info(self) -> ModelInfo:
        raw = _native.ModelInfo()
        raw.struct_size = ctypes.sizeof(raw)
        check(lib.llm_model_get_info(self._handle(), ctypes.byref(raw)))
        return ModelInfo(
            architecture=(raw.architecture or b"").decode("utf-8", "replace"),
            name=(raw.name or b"").decode("utf-8", "replace"),
            n_params=raw.n_params,
            weight_bytes=raw.weight_bytes,
            n_layers=raw.n_layers,
            n_embd=raw.n_embd,
            n_heads=raw.n_heads,
            n_kv_heads=raw.n_kv_heads,
            n_ff=raw.n_ff,
            n_vocab=raw.n_vocab,
            n_ctx_train=raw.n_ctx_train,
            bos=_token_or_none(raw.bos),
            eos=_token_or_none(raw.eos),
            eot=_token_or_none(raw.eot),
            pad=_token_or_none(raw.pad),
            has_chat_template=bool(raw.has_chat_template),
        )

    @property
    def info(self) -> ModelInfo:
        """Architecture, sizes and special tokens (copied at load)."""
        self._handle()
        return self._info

    # --- tokenizer ---------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False,
                 strict: bool = False) -> List[int]:
        """UTF-8 text to token ids.

        ``add_special`` adds the BOS token where the model has one,
        ``parse_special`` turns texts like ``"<|im_start|>"`` into their
        token, ``strict`` refuses bytes the vocabulary cannot encode.
        """
        flags = TokenizeFlag(0)
        if add_special:
            flags |= TokenizeFlag.ADD_SPECIAL
        if parse_special:
            flags |= TokenizeFlag.PARSE_SPECIAL
        if strict:
            flags |= TokenizeFlag.STRICT
        data = text.encode("utf-8")
        ptr = self._handle()
        # Each byte gives at most one token, plus the special ones added.
        capacity = len(data) + 8
        count = ctypes.c_size_t(0)
        for _ in range(3):
            tokens = (_native.c_token * max(capacity, 1))()
            status = lib.llm_tokenize(ptr, data, len(data), int(flags), tokens, capacity,
                                      ctypes.byref(count))
            if status == Status.BUFFER_TOO_SMALL and count.value > capacity:
                capacity = count.value
                continue
            check(status)
            return list(tokens[: count.value])
        raise error_for(Status.BUFFER_TOO_SMALL, "the token count kept growing")

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        """Token ids to text; ``special`` renders control tokens too."""
        ptr = self._handle()
        array = (_native.c_token * max(len(tokens), 1))(*tokens)
        flags = 1 if special else 0
        return read_text(
            lambda buf, cap, n: lib.llm_detokenize(ptr, array, len(tokens), flags, buf, cap,
                                                   ctypes.byref(n)),
            first_capacity=16 * len(tokens) + 16,
        )

    def token_text(self, token: int, *, special: bool = True) -> str:
        """The text of one token."""
        return self.detokenize([token], special=special)

    def detokenizer(self, *, special: bool = False) -> "Detokenizer":
        """A streaming detokenizer that holds back split UTF-8 characters."""
        return Detokenizer(self, special=special)

    # --- chat --------------------------------------------------------------

    @property
    def chat_template(self) -> Optional[str]:
        """The model's own (default) chat template text, or None."""
        return self.named_chat_template(None)

    def named_chat_template(self, name: Optional[str]) -> Optional[str]:
        """The model's chat template of that name ("tool_use", ...; None:
        the default one), or None when it has none."""
        text = ctypes.c_char_p()
        key = name.encode("utf-8") if name is not None else None
        check(lib.llm_model_chat_template(self._handle(), key, ctypes.byref(text)))
        return text.value.decode("utf-8") if text.value is not None else None

    def apply_chat_template(self, messages: Iterable[ChatMessage], *,
                            add_generation_prompt: bool = True,
                            continue_final_message: bool = False,
                            tools: Optional[Sequence[Mapping[str, Any]]] = None,
                            documents: Optional[Sequence[Mapping[str, Any]]] = None,
                            chat_template: Optional[str] = None,
                            **variables: Any) -> str:
        """Renders messages with the model's own chat template (or
        ``chat_template``: template text, or the name of one of the model's
        templates such as "tool_use"), run as Jinja the way transformers'
        ``apply_chat_template`` runs it (which picks "tool_use", when the
        model has it, for a call with tools): ``tools``, ``documents`` and any
        further keyword (``enable_thinking=False``, ...) become template
        variables. ``continue_final_message`` ends the text after the last
        message (for the model to continue it; needs
        ``add_generation_prompt=False``).

        Raises :class:`UnsupportedError` for a model without a template and
        no ``chat_template``; :class:`InvalidArgumentError` when the template
        has an error or raises (its message says why); :class:`LimitError`
        when it runs past the interpreter's limits.
        """
        listed = [_message_dict(m) for m in messages]
        params = _native.ChatParams()
        lib.llm_chat_params_init_sized(ctypes.byref(params), ctypes.sizeof(params))
        encoded = {
            "messages_json": _json(listed),
            "tools_json": _json(tools) if tools is not None else None,
            "documents_json": _json(documents) if documents is not None else None,
            "variables_json": _json(variables) if variables else None,
            "template_text": None,
            "template_name": None,
        }
        if chat_template is not None:
            # like transformers: a name of one of the model's templates, or template text
            named = "{" not in chat_template and self.named_chat_template(chat_template)
            key = "template_name" if named else "template_text"
            encoded[key] = chat_template.encode("utf-8")
        for field, value in encoded.items():
            setattr(params, field, value)
        params.add_generation_prompt = add_generation_prompt
        params.continue_final_message = continue_final_message
        ptr = self._handle()
        return read_text(
            lambda buf, cap, n: lib.llm_chat_apply(ptr, ctypes.byref(params), buf, cap,
                                                   ctypes.byref(n)),
            first_capacity=len(encoded["messages_json"] or b"") * 2 + 256,
        )

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._info.architecture} {self._info.name!r}"
        return f"<llminfer.Model {self.path!r} {state}>"


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def _message_dict(message: ChatMessage) -> Dict[str, Any]:
    if isinstance(message, Mapping):
        return dict(message)
    role, content = message
    return {"role": str(role), "content": str(content)}


def _role_content(message: ChatMessage) -> Tuple[str, str]:
    if isinstance(message, Mapping):
        return str(message["role"]), str(message["content"])
    role, content = message
    return str(role), str(content)


class Detokenizer(Closeable):
    """``llm_detokenizer``: push tokens, get whole UTF-8 characters back."""

    def __init__(self, model: Model, *, special: bool = False) -> None:
        self._ptr: Optional[int] = None
        self._model = model  # keeps the borrowed model alive
        out = _native.p_detok()
        check(lib.llm_detokenizer_create(model._handle(), 1 if special else 0,
                                         ctypes.byref(out)))
        self._ptr = out.value

    def _handle(self) -> int:
        if self._ptr is None or self._model.closed:
            raise ClosedError("detokenizer")
        return self._ptr

    def push(self, token: int) -> str:
        ptr = self._handle()
        return read_text(
            lambda buf, cap, n: lib.llm_detokenizer_push(ptr, token, buf, cap, ctypes.byref(n)),
            first_capacity=64,
        )

    def flush(self) -> str:
        ptr = self._handle()
        return read_text(
            lambda buf, cap, n: lib.llm_detokenizer_flush(ptr, buf, cap, ctypes.byref(n)),
            first_capacity=64,
        )

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            lib.llm_detokenizer_free(ptr)

