"""Parameter and result types shared by sessions and requests."""

from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional, Tuple

from . import _native
from ._native import lib


class KvType(enum.IntEnum):
    """``llm_kv_type``: element type of the cached keys and values."""

    F32 = 0
    F16 = 1
    BF16 = 2
    #: Since libllminfer 1.4: GGUF Q8_0 / Q4_0 blocks of 32 per head row
    #: (needs a head_dim that is a multiple of 32; Q4_0 on the CPU backend
    #: only, Q8_0 on CUDA too since 1.5).
    Q8_0 = 3
    Q4_0 = 4
    #: Since libllminfer 1.5: OCP FP8 E4M3 in blocks of 32 with an f32 scale
    #: (needs a head_dim that is a multiple of 32; CPU and CUDA backends).
    FP8_E4M3 = 5


class SpecMode(enum.IntEnum):
    """``llm_spec_mode``: how speculative drafts are proposed."""

    NONE = 0
    NGRAM = 1
    DRAFT = 2


class FinishReason(enum.IntEnum):
    """``llm_finish_reason``: why generation ended."""

    NONE = 0
    EOS = 1
    LENGTH = 2
    STOP = 3
    CANCELLED = 4
    ERROR = 5


class LogLevel(enum.IntEnum):
    DEBUG = 0
    INFO = 1
    WARN = 2
    ERROR = 3


@dataclass
class SamplingParams:
    """``llm_sampling_params``; a field left ``None`` keeps the library default.

    The library's defaults sample (temperature 0.8, top-k 40, top-p 0.95,
    min-p 0.05); ``temperature=0`` or ``top_k=1`` is greedy. Passing no
    sampling params at all to a generation call is greedy as well.
    ``logit_bias`` maps token ids to the bias added to their logit
    (``float("-inf")`` bans a token).
    """

    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    repeat_penalty: Optional[float] = None
    repeat_last_n: Optional[int] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    min_tokens: Optional[int] = None
    #: a compiled :class:`~llminfer.grammar.Grammar` (kept open while used)
    grammar: Optional[Any] = None

    def _to_c(self) -> Tuple[_native.SamplingParams, Any]:
        """The C struct, and the array it points into (keep both alive)."""
        raw = _native.SamplingParams()
        lib.llm_sampling_params_init_sized(ctypes.byref(raw), ctypes.sizeof(raw))
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("logit_bias", "grammar") or value is None:
                continue
            setattr(raw, f.name, value)
        if self.grammar is not None:
            raw.grammar = self.grammar._handle()
        bias_array = None
        if self.logit_bias:
            items = list(self.logit_bias.items())
            bias_array = (_native.LogitBias * len(items))()
            for slot, (token, bias) in zip(bias_array, items):
                slot.token = int(token)
                slot.bias = float(bias)
            raw.logit_bias = bias_array
            raw.n_logit_bias = len(items)
        return raw, bias_array


@dataclass(frozen=True)
class GenerateResult:
    """What a blocking :meth:`Session.generate` produced."""

    text: str
    tokens: Tuple[int, ...]
    finish_reason: FinishReason
    n_prompt_tokens: int
    n_generated_tokens: int
    prompt_seconds: float
    generate_seconds: float
    n_spec_steps: int = 0
    n_draft_tokens: int = 0
    n_accepted_tokens: int = 0


@dataclass(frozen=True)
class Event:
    """One ``llm_event``, copied out of the library's borrowed memory.

    ``token`` is ``None`` on a finish-only event; ``finish_reason`` is
    :attr:`FinishReason.NONE` except on a sample's last event, and
    ``status`` says why when it is :attr:`FinishReason.ERROR`.
    """

    request_id: int
    token: Optional[int]
    text: str
    logprob: float
    finish_reason: FinishReason
    status: int
    top_tokens: Tuple[int, ...] = ()
    top_logprobs: Tuple[float, ...] = ()
    sample_index: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason != FinishReason.NONE

    @classmethod
    def _from_c(cls, raw: _native.Event) -> "Event":
        text = ctypes.string_at(raw.text, raw.text_len) if raw.text and raw.text_len else b""
        n_top = raw.n_top
        return cls(
            request_id=raw.request,
            token=None if raw.token == -1 else raw.token,
            text=text.decode("utf-8", "replace"),
            logprob=raw.logprob,
            finish_reason=FinishReason(raw.finish_reason),
            status=raw.status,
            top_tokens=tuple(raw.top_tokens[:n_top]) if n_top and raw.top_tokens else (),
            top_logprobs=tuple(raw.top_logprobs[:n_top]) if n_top and raw.top_logprobs else (),
            sample_index=raw.sample_index,
        )


@dataclass(frozen=True)
class SessionStats:
    """``llm_session_stats``: counters and gauges of a session."""

    n_running: int
    n_waiting: int
    block_size: int
    blocks_total: int
    blocks_used: int
    blocks_cached: int
    blocks_free: int
    kv_tokens_used: int
    prefix_hit_tokens: int
    prompt_tokens: int
    generated_tokens: int
    preemptions: int
    steps: int
    spec_steps: int
    spec_draft_tokens: int
    spec_accepted_tokens: int

    @classmethod
    def _from_c(cls, raw: _native.SessionStats) -> "SessionStats":
        return cls(**{f.name: getattr(raw, f.name) for f in fields(cls)})
