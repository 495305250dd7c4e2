"""Embeddings: final hidden states of token sequences, pooled or per token
(``llm_session_embed``, API 1.3).

Inputs run as temporary sequences of the session, several in one forward
pass, and leave nothing behind. Like the token-level calls they step the
session, one thread at a time.
"""

from __future__ import annotations

import array
import ctypes
import enum
from typing import TYPE_CHECKING, List, Sequence, Union

from . import _native
from ._native import lib
from .errors import UnsupportedError

if TYPE_CHECKING:
    from .model import Model
    from ._handles import _SessionHandle

Input = Union[str, Sequence[int]]


class Pooling(enum.IntEnum):
    """``llm_pooling``: how the per-token states become one vector."""

    MODEL = 0  # the model file's choice, else MEAN
    NONE = 1  # one vector per token
    MEAN = 2
    FIRST = 3  # the first token (BERT's CLS)
    LAST = 4


def _require(name: str) -> None:
    if not _native.has(name):
        raise UnsupportedError(
            f"the loaded libllminfer {_native.version_string()} has no {name} "
            "(embeddings need API 1.3)"
        )


def model_pooling(model: "Model") -> Pooling:
    """The pooling :attr:`Pooling.MODEL` stands for on ``model``."""
    _require("llm_model_pooling")
    out = _native.c_enum(0)
    status = lib.llm_model_pooling(model._handle(), ctypes.byref(out))
    if status:
        from .errors import error_for, thread_last_error

        raise error_for(status, thread_last_error())
    return Pooling(out.value)


class EmbedMixin:
    """The embedding method of :class:`Session`."""

    if TYPE_CHECKING:
        model: Model

        def _ptr(self) -> int: ...
        def _stepping_box(self) -> "_SessionHandle": ...
        def _check(self, ptr: int, status: int) -> None: ...

    def embed(
        self,
        inputs: Union[Input, Sequence[Input]],
        *,
        pooling: Pooling = Pooling.MODEL,
        normalize: bool = True,
    ) -> List["array.array[float]"]:
        """Embeds a text, a list of token ids, or a list of either.

        Texts are tokenized with the model's special tokens added (BOS where
        it has one) and special-token text read as plain text. Returns one
        ``array('f')`` of n_embd floats per input, or with
        ``pooling=Pooling.NONE`` one per token of every input, in order.
        ``normalize`` scales each vector to unit length.
        """
        _require("llm_session_embed")
        if isinstance(inputs, str) or (
            isinstance(inputs, Sequence) and inputs and isinstance(inputs[0], int)
        ):
            inputs = [inputs]  # type: ignore[list-item]
        token_lists: List[List[int]] = []
        for item in inputs:  # type: ignore[union-attr]
            if isinstance(item, str):
                token_lists.append(self.model.tokenize(item, add_special=True))
            else:
                token_lists.append([int(t) for t in item])
        n = len(token_lists)
        arrays = [(_native.c_token * max(len(t), 1))(*t) for t in token_lists]
        ptrs = (ctypes.POINTER(_native.c_token) * max(n, 1))(
            *[ctypes.cast(a, ctypes.POINTER(_native.c_token)) for a in arrays]
        )
        lengths = (ctypes.c_size_t * max(n, 1))(*[len(t) for t in token_lists])
        params = _native.EmbedParams()
        lib.llm_embed_params_init_sized(ctypes.byref(params), ctypes.sizeof(params))
        params.pooling = int(pooling)
        params.normalize = bool(normalize)
        n_embd = self.model.info.n_embd
        rows = sum(len(t) for t in token_lists) if pooling == Pooling.NONE else n
        capacity = rows * n_embd
        out = (ctypes.c_float * max(capacity, 1))()
        written = ctypes.c_size_t(0)
        with self._stepping_box().lock:
            ptr = self._ptr()
            self._check(
                ptr,
                lib.llm_session_embed(ptr, ptrs, lengths, n, ctypes.byref(params), out,
                                      capacity, ctypes.byref(written)),
            )
        data = bytes(out)[: written.value * ctypes.sizeof(ctypes.c_float)]
        vectors = []
        for r in range(written.value // n_embd if n_embd else 0):
            v = array.array("f")
            v.frombytes(data[r * n_embd * 4 : (r + 1) * n_embd * 4])
            vectors.append(v)
        return vectors
