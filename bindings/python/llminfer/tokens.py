"""Token level: host-driven decoding, saved states and the standalone sampler.

For hosts that schedule and sample themselves. Sequences live in the same
KV memory as requests; like the rest of a session's stepping calls, these
run under the session's lock, one thread at a time.
"""

from __future__ import annotations

import array
import ctypes
import os
from typing import TYPE_CHECKING, Any, Iterable, List, Optional, Sequence, Tuple, Union

from . import _native
from ._closeable import Closeable
from ._native import has, lib
from .errors import ClosedError, Status, UnsupportedError, check, error_for
from .model import Model
from .params import SamplingParams

if TYPE_CHECKING:
    from ._handles import _SessionCalls, _SessionHandle

PathLike = Union[str, "os.PathLike[str]"]
Logits = Union["array.array[float]", Sequence[float]]

_MAX_ATTEMPTS = 4


class TokenSequence:
    """An ``llm_seq_id`` of a session: tokens with their keys and values."""

    def __init__(self, session: "_SessionCalls", seq_id: int, adapter: Any = None) -> None:
        self.session = session
        self.id = seq_id
        self._adapter = adapter  # a LoRA adapter the library borrows while the sequence lives

    def _call(self, fn: Any, *args: Any) -> None:
        session = self.session
        with session._stepping_box().lock:
            ptr = session._ptr()
            session._check(ptr, fn(ptr, self.id, *args))

    def __len__(self) -> int:
        n_tokens = ctypes.c_uint32(0)
        self._call(lib.llm_seq_length, ctypes.byref(n_tokens))
        return n_tokens.value

    def fork(self) -> "TokenSequence":
        """A new sequence sharing every KV block of this one (copy-on-write)."""
        out = _native.c_seq_id(0)
        self._call(lib.llm_seq_fork, ctypes.byref(out))
        return TokenSequence(self.session, out.value, self._adapter)

    def set_adapter(self, adapter: Any, scale: float = 1.0) -> None:
        """``llm_seq_set_adapter``: runs the sequence with ``adapter`` (an
        :class:`Adapter` of the session's model, or None) at ``scale``. Only
        while the sequence is empty, or, for a sequence restored from a state
        saved under an adapter (which refuses to decode until then), with an
        adapter of the same content (another load of the same file does) and
        the same scale; :class:`InvalidArgumentError` otherwise."""
        if not has("llm_seq_set_adapter"):
            raise UnsupportedError("this libllminfer has no LoRA adapters (API 1.4 adds them)")
        handle = adapter._handle() if adapter is not None else None
        self._call(lib.llm_seq_set_adapter, handle, ctypes.c_float(scale))
        self._adapter = adapter

    def truncate(self, n_tokens: int) -> None:
        """Forgets positions ``>= n_tokens``."""
        self._call(lib.llm_seq_truncate, n_tokens)

    def close(self) -> None:
        """Closes the sequence and frees its KV blocks."""
        self._call(lib.llm_seq_close)

    def tokens(self) -> List[int]:
        """The tokens decoded into the sequence."""
        session = self.session
        capacity = 256
        count = ctypes.c_size_t(0)
        with session._stepping_box().lock:
            ptr = session._ptr()
            for _ in range(_MAX_ATTEMPTS):
                buf = (_native.c_token * capacity)()
                status = lib.llm_seq_tokens(ptr, self.id, buf, capacity, ctypes.byref(count))
                if status == Status.BUFFER_TOO_SMALL and count.value > capacity:
                    capacity = count.value
                    continue
                session._check(ptr, status)
                return list(buf[: count.value])
        raise error_for(Status.BUFFER_TOO_SMALL, "the sequence kept growing")

    def save(self) -> bytes:
        """The sequence's state (``llm_seq_state_save``)."""
        return _save_bytes(self.session, lambda ptr, buf, cap, size: lib.llm_seq_state_save(
            ptr, self.id, buf, cap, size))

    def save_file(self, path: PathLike) -> None:
        """Saves the state to ``path``, replaced atomically."""
        self._call(lib.llm_seq_state_save_file, os.fsencode(os.fspath(path)))

    def __repr__(self) -> str:
        return f"<llminfer.TokenSequence {self.id}>"


def _save_bytes(session: "_SessionCalls", call: Any) -> bytes:
    size = ctypes.c_size_t(0)
    with session._stepping_box().lock:
        ptr = session._ptr()
        status = call(ptr, None, 0, ctypes.byref(size))
        for _ in range(_MAX_ATTEMPTS):
            if status != Status.BUFFER_TOO_SMALL:
                break
            capacity = size.value
            buf = ctypes.create_string_buffer(max(capacity, 1))
            status = call(ptr, buf, capacity, ctypes.byref(size))
            if status == Status.OK:
                return buf.raw[: size.value]
        session._check(ptr, status)
        # A state that needs no bytes at all would come back OK at once.
        return b""


class Batch(Closeable):
    """``llm_batch``: the rows (sequence, position, token, logits?) of one decode."""

    def __init__(self, capacity: int) -> None:
        self._ptr: Optional[int] = None
        out = _native.p_batch()
        check(lib.llm_batch_create(capacity, ctypes.byref(out)))
        self._ptr = out.value
        self.capacity = capacity
        self._rows = 0

    def _handle(self) -> int:
        if self._ptr is None:
            raise ClosedError("batch")
        return self._ptr

    def add(self, seq: Union[TokenSequence, int], pos: int, token: int,
            logits: bool = False) -> int:
        """Appends a row; returns its index (for :meth:`Session.logits`)."""
        seq_id = seq.id if isinstance(seq, TokenSequence) else int(seq)
        check(lib.llm_batch_add(self._handle(), seq_id, pos, token, logits))
        self._rows += 1
        return self._rows - 1

    def add_tokens(self, seq: Union[TokenSequence, int], start: int, tokens: Iterable[int],
                   logits_last: bool = True) -> int:
        """Appends ``tokens`` at positions from ``start``; logits on the last."""
        items = list(tokens)
        row = -1
        for i, token in enumerate(items):
            row = self.add(seq, start + i, token, logits_last and i == len(items) - 1)
        return row

    def clear(self) -> None:
        lib.llm_batch_clear(self._handle())
        self._rows = 0

    def __len__(self) -> int:
        return self._rows

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            lib.llm_batch_free(ptr)



def _as_float_array(logits: Logits, n_vocab: int) -> Any:
    if isinstance(logits, array.array) and logits.typecode == "f":
        if len(logits) != n_vocab:
            raise error_for(Status.INVALID_ARGUMENT,
                            f"logits has {len(logits)} entries, the vocabulary {n_vocab}")
        return (ctypes.c_float * n_vocab).from_buffer(logits)
    values = list(logits)
    if len(values) != n_vocab:
        raise error_for(Status.INVALID_ARGUMENT,
                        f"logits has {len(values)} entries, the vocabulary {n_vocab}")
    return (ctypes.c_float * n_vocab)(*values)


class Sampler(Closeable):
    """``llm_sampler``: the sampling pipeline for host-driven decoding.

    ``sampling=None`` is greedy; ``stream`` joins the seed in keying the
    random numbers. One sampler per token stream, one thread at a time.
    """

    def __init__(self, model: Model, sampling: Optional[SamplingParams] = None,
                 stream: int = 0) -> None:
        self._ptr: Optional[int] = None
        self._model = model  # borrowed by the sampler
        self._n_vocab = model.info.n_vocab
        raw: Any = None
        keep_alive: Any = None
        if sampling is not None:
            raw, keep_alive = sampling._to_c()
        out = _native.p_sampler()
        check(lib.llm_sampler_create(model._handle(),
                                     ctypes.byref(raw) if raw is not None else None,
                                     stream, ctypes.byref(out)))
        del keep_alive  # the library copied the params, logit bias included
        self._ptr = out.value

    def _handle(self) -> int:
        if self._ptr is None or self._model.closed:
            raise ClosedError("sampler")
        return self._ptr

    def sample(self, logits: Logits, history: Sequence[int] = (), n_generated: int = 0,
               position: Optional[int] = None) -> int:
        """Picks the next token; ``position`` defaults to ``len(history)``."""
        ptr = self._handle()
        values = _as_float_array(logits, self._n_vocab)
        past = (_native.c_token * max(len(history), 1))(*history)
        out = _native.c_token(-1)
        check(lib.llm_sampler_sample(ptr, values, past, len(history), n_generated,
                                     len(history) if position is None else position,
                                     ctypes.byref(out)))
        return out.value

    def logprobs(self, logits: Logits, top_n: int) -> List[Tuple[int, float]]:
        """The ``top_n`` most likely tokens and their log-probabilities."""
        ptr = self._handle()
        values = _as_float_array(logits, self._n_vocab)
        tokens = (_native.c_token * max(top_n, 1))()
        logprobs = (ctypes.c_float * max(top_n, 1))()
        count = ctypes.c_uint32(0)
        check(lib.llm_sampler_logprobs(ptr, values, top_n, tokens, logprobs,
                                       ctypes.byref(count)))
        return [(tokens[i], logprobs[i]) for i in range(count.value)]

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            lib.llm_sampler_free(ptr)



class TokenLevelMixin:
    """The token-level methods of :class:`Session`."""

    if TYPE_CHECKING:
        model: Model

        def _ptr(self) -> int: ...
        def _stepping_box(self) -> "_SessionHandle": ...
        def _check(self, ptr: int, status: int) -> None: ...

    def _as_session(self) -> "_SessionCalls":
        return self  # type: ignore[return-value]

    def open_sequence(self) -> TokenSequence:
        """``llm_seq_open``: an empty sequence."""
        out = _native.c_seq_id(0)
        with self._stepping_box().lock:
            ptr = self._ptr()
            self._check(ptr, lib.llm_seq_open(ptr, ctypes.byref(out)))
        return TokenSequence(self._as_session(), out.value)

    def sequence(self, seq_id: int) -> TokenSequence:
        """Wraps the id of a sequence that is already open (after load_state)."""
        return TokenSequence(self._as_session(), seq_id)

    def decode(self, batch: Batch) -> None:
        """Computes every row of ``batch`` in one forward pass (all or none)."""
        with self._stepping_box().lock:
            ptr = self._ptr()
            self._check(ptr, lib.llm_session_decode(ptr, batch._handle()))

    def logits(self, row: int) -> "array.array[float]":
        """A copy of the logits of ``row`` of the last decoded batch."""
        n_vocab = self.model.info.n_vocab
        out = ctypes.POINTER(ctypes.c_float)()
        with self._stepping_box().lock:
            ptr = self._ptr()
            self._check(ptr, lib.llm_session_logits(ptr, row, ctypes.byref(out)))
            copied = array.array("f")
            copied.frombytes(ctypes.string_at(out, n_vocab * ctypes.sizeof(ctypes.c_float)))
        return copied

    def load_sequence(self, data: bytes) -> TokenSequence:
        """Opens a sequence from a state made by :meth:`TokenSequence.save`."""
        out = _native.c_seq_id(-1)
        with self._stepping_box().lock:
            ptr = self._ptr()
            self._check(ptr, lib.llm_seq_state_load(ptr, data, len(data), ctypes.byref(out)))
        return TokenSequence(self._as_session(), out.value)

    def load_sequence_file(self, path: PathLike) -> TokenSequence:
        out = _native.c_seq_id(-1)
        with self._stepping_box().lock:
            ptr = self._ptr()
            self._check(ptr, lib.llm_seq_state_load_file(ptr, os.fsencode(os.fspath(path)),
                                                         ctypes.byref(out)))
        return TokenSequence(self._as_session(), out.value)

    def save_state(self) -> bytes:
        """Every open token-level sequence, with its id."""
        return _save_bytes(self._as_session(), lib.llm_session_state_save)

    def load_state(self, data: bytes) -> None:
        """Re-creates the sequences of :meth:`save_state` under their ids."""
        with self._stepping_box().lock:
            ptr = self._ptr()
            self._check(ptr, lib.llm_session_state_load(ptr, data, len(data)))

    def save_state_file(self, path: PathLike) -> None:
        with self._stepping_box().lock:
            ptr = self._ptr()
            self._check(ptr, lib.llm_session_state_save_file(ptr, os.fsencode(os.fspath(path))))

    def load_state_file(self, path: PathLike) -> None:
        with self._stepping_box().lock:
            ptr = self._ptr()
            self._check(ptr, lib.llm_session_state_load_file(ptr, os.fsencode(os.fspath(path))))
