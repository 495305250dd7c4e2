"""ctypes declarations of llm.h: library lookup, struct mirrors, prototypes.

Everything here is private. The struct layouts are compared with the loaded
library's own (``llm_struct_size`` / ``llm_struct_offset``) at import, so a
library built with a different header is refused instead of corrupting
memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_bool,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int32,
    c_size_t,
    c_uint,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Any, Dict, List, Optional, Tuple, Type

REQUIRED_MAJOR = 1
REQUIRED_MINOR = 2
SIZE_MAX = ctypes.c_size_t(-1).value

c_status = c_int
c_token = c_int32
c_request_id = c_uint64
c_enum = c_int  # every C enum of llm.h has int-sized values


class LibraryNotFoundError(ImportError):
    """libllminfer could not be found or does not fit this binding."""


def _open_library() -> ctypes.CDLL:
    tried: List[str] = []
    explicit = os.environ.get("LLMINFER_LIBRARY")
    if explicit:
        try:
            return ctypes.CDLL(explicit)
        except OSError as exc:
            raise LibraryNotFoundError(
                f"LLMINFER_LIBRARY={explicit!r} could not be loaded: {exc}"
            ) from exc
    # dlopen's own search (LD_LIBRARY_PATH, the ldconfig cache) comes first
    # because ctypes.util.find_library ignores LD_LIBRARY_PATH on many systems.
    candidates = ["libllminfer.so.1"]
    found = ctypes.util.find_library("llminfer")
    if found:
        candidates.append(found)
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            tried.append(f"{name}: {exc}")
    raise LibraryNotFoundError(
        "libllminfer (API 1.2 or newer) was not found. Install it where the "
        "dynamic loader looks (or add its lib directory to LD_LIBRARY_PATH), "
        "or set LLMINFER_LIBRARY to the full path of libllminfer.so.1. Tried: "
        + "; ".join(tried)
    )


lib = _open_library()


# --- structs: field order and types exactly as in llm.h -------------------


# llm_progress_fn (since 1.3): (phase, done, total, user) -> keep going
PROGRESS_FN = CFUNCTYPE(c_bool, c_enum, c_uint64, c_uint64, c_void_p)


class ModelParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("use_mmap", c_bool),
        ("error_message", POINTER(c_char)),
        ("error_capacity", c_size_t),
        ("progress", PROGRESS_FN),  # 1.3
        ("progress_user", c_void_p),
    ]


class ModelInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("architecture", c_char_p),
        ("name", c_char_p),
        ("n_params", c_uint64),
        ("weight_bytes", c_uint64),
        ("n_layers", c_uint32),
        ("n_embd", c_uint32),
        ("n_heads", c_uint32),
        ("n_kv_heads", c_uint32),
        ("n_ff", c_uint32),
        ("n_vocab", c_uint32),
        ("n_ctx_train", c_uint32),
        ("bos", c_token),
        ("eos", c_token),
        ("eot", c_token),
        ("pad", c_token),
        ("has_chat_template", c_bool),
    ]


class ChatMessage(Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


class ChatParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("messages_json", c_char_p),
        ("tools_json", c_char_p),
        ("documents_json", c_char_p),
        ("variables_json", c_char_p),
        ("template_text", c_char_p),
        ("template_name", c_char_p),
        ("add_generation_prompt", c_bool),
        ("continue_final_message", c_bool),
    ]


class SessionParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("n_threads", c_uint32),
        ("n_ctx", c_uint32),
        ("max_batch_tokens", c_uint32),
        ("kv_cache_bytes", c_uint64),
        ("kv_type", c_enum),
        ("kv_block_size", c_uint32),
        ("prefix_cache", c_bool),
        ("draft_model", c_void_p),
        ("error_message", POINTER(c_char)),
        ("error_capacity", c_size_t),
        ("progress", PROGRESS_FN),  # 1.3
        ("progress_user", c_void_p),
    ]


class LogitBias(Structure):
    _fields_ = [("token", c_token), ("bias", c_float)]


class SamplingParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("temperature", c_float),
        ("top_k", c_int32),
        ("top_p", c_float),
        ("min_p", c_float),
        ("seed", c_uint64),
        ("repeat_penalty", c_float),
        ("repeat_last_n", c_int32),
        ("presence_penalty", c_float),
        ("frequency_penalty", c_float),
        ("logit_bias", POINTER(LogitBias)),
        ("n_logit_bias", c_size_t),
        ("min_tokens", c_uint32),
        ("grammar", c_void_p),  # since 1.3
    ]


class GrammarParams(Structure):  # since 1.3
    _fields_ = [("struct_size", c_uint32), ("whitespace", c_uint32), ("root", c_char_p)]


TOKEN_FN = CFUNCTYPE(c_bool, c_token, POINTER(c_char), c_size_t, c_void_p)
LOG_FN = CFUNCTYPE(None, c_enum, c_char_p, c_void_p)


class GenerateParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("max_new_tokens", c_uint32),
        ("sampling", POINTER(SamplingParams)),
        ("on_token", TOKEN_FN),
        ("user", c_void_p),
        ("ignore_eos", c_bool),
        ("spec_mode", c_uint32),
        ("spec_k", c_uint32),
        ("adapter", c_void_p),  # since 1.4 (OPTIONAL_FIELDS)
        ("adapter_scale", c_float),
    ]


class GenerateResult(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("finish_reason", c_enum),
        ("n_prompt_tokens", c_uint32),
        ("n_generated_tokens", c_uint32),
        ("prompt_seconds", c_double),
        ("generate_seconds", c_double),
        ("n_spec_steps", c_uint32),
        ("n_draft_tokens", c_uint32),
        ("n_accepted_tokens", c_uint32),
    ]


class RequestParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("sampling", POINTER(SamplingParams)),
        ("max_new_tokens", c_uint32),
        ("priority", c_int32),
        ("ignore_eos", c_bool),
        ("logprobs", c_bool),
        ("stop_tokens", POINTER(c_token)),
        ("n_stop_tokens", c_size_t),
        ("stop_strings", POINTER(c_char_p)),
        ("n_stop_strings", c_size_t),
        ("top_logprobs", c_uint32),
        ("spec_mode", c_uint32),
        ("spec_k", c_uint32),
        ("n_samples", c_uint32),
        ("adapter", c_void_p),  # since 1.4 (OPTIONAL_FIELDS)
        ("adapter_scale", c_float),
    ]


class AdapterParams(Structure):  # since 1.4
    _fields_ = [("struct_size", c_uint32), ("use_mmap", c_bool)]


class Event(Structure):
    _fields_ = [
        ("request", c_request_id),
        ("token", c_token),
        ("text", POINTER(c_char)),
        ("text_len", c_size_t),
        ("logprob", c_float),
        ("finish_reason", c_enum),
        ("status", c_status),
        ("top_tokens", POINTER(c_token)),
        ("top_logprobs", POINTER(c_float)),
        ("n_top", c_uint32),
        ("sample_index", c_uint32),
    ]


class SessionStats(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("n_running", c_uint32),
        ("n_waiting", c_uint32),
        ("block_size", c_uint32),
        ("blocks_total", c_uint32),
        ("blocks_used", c_uint32),
        ("blocks_cached", c_uint32),
        ("blocks_free", c_uint32),
        ("kv_tokens_used", c_uint64),
        ("prefix_hit_tokens", c_uint64),
        ("prompt_tokens", c_uint64),
        ("generated_tokens", c_uint64),
        ("preemptions", c_uint64),
        ("steps", c_uint64),
        ("spec_steps", c_uint64),
        ("spec_draft_tokens", c_uint64),
        ("spec_accepted_tokens", c_uint64),
    ]


class EmbedParams(Structure):
    """Since API 1.3 (optional: see OPTIONAL_STRUCTS)."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("pooling", c_enum),
        ("normalize", c_bool),
    ]


class DeviceParams(Structure):
    """llm_device_params (the experimental part of llm.h)."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("backend", c_char_p),
        ("devices", POINTER(c_int32)),
        ("n_devices", c_uint32),
        ("tensor_parallel", c_uint32),
    ]


STRUCTS: Dict[str, Type[Structure]] = {
    "llm_model_params": ModelParams,
    "llm_model_info": ModelInfo,
    "llm_chat_message": ChatMessage,
    "llm_chat_params": ChatParams,
    "llm_session_params": SessionParams,
    "llm_logit_bias": LogitBias,
    "llm_sampling_params": SamplingParams,
    "llm_generate_params": GenerateParams,
    "llm_generate_result": GenerateResult,
    "llm_request_params": RequestParams,
    "llm_event": Event,
    "llm_session_stats": SessionStats,
    "llm_device_params": DeviceParams,
    "llm_grammar_params": GrammarParams,
}

# Structs of newer API versions: checked where the library knows them
# (llm_struct_size gives 0 for a name it does not), so the binding keeps
# working on an API 1.2 library without the features they belong to.
OPTIONAL_STRUCTS: Dict[str, Type[Structure]] = {
    "llm_embed_params": EmbedParams,
    "llm_adapter_params": AdapterParams,
}

# Fields appended in newer API versions, at the end of their struct: an
# older library lacks them (llm_struct_offset says so) and reads only the
# bytes before them, so they are left out of the check there.
OPTIONAL_FIELDS: Dict[str, Tuple[str, ...]] = {
    "llm_generate_params": ("adapter", "adapter_scale"),
    "llm_request_params": ("adapter", "adapter_scale"),
}

# --- prototypes ------------------------------------------------------------

p_model = c_void_p
p_session = c_void_p
p_detok = c_void_p
p_batch = c_void_p
p_sampler = c_void_p
c_seq_id = c_int32

_PROTOTYPES: List[Tuple[str, Any, List[Any]]] = [
    ("llm_version_number", c_uint, []),
    ("llm_version_string", c_char_p, []),
    ("llm_struct_size", c_size_t, [c_char_p]),
    ("llm_struct_offset", c_size_t, [c_char_p, c_char_p]),
    ("llm_status_str", c_char_p, [c_status]),
    ("llm_status_name", c_char_p, [c_status]),
    ("llm_last_error", c_char_p, []),
    ("llm_log_set", None, [LOG_FN, c_enum, c_void_p]),
    ("llm_model_params_init_sized", None, [POINTER(ModelParams), c_size_t]),
    ("llm_model_load", c_status, [c_char_p, POINTER(ModelParams), POINTER(p_model)]),
    ("llm_model_free", None, [p_model]),
    ("llm_model_get_info", c_status, [p_model, POINTER(ModelInfo)]),
    (
        "llm_tokenize",
        c_status,
        [p_model, c_char_p, c_size_t, c_uint32, POINTER(c_token), c_size_t, POINTER(c_size_t)],
    ),
    (
        "llm_detokenize",
        c_status,
        [p_model, POINTER(c_token), c_size_t, c_uint32, POINTER(c_char), c_size_t,
         POINTER(c_size_t)],
    ),
    ("llm_detokenizer_create", c_status, [p_model, c_uint32, POINTER(p_detok)]),
    (
        "llm_detokenizer_push",
        c_status,
        [p_detok, c_token, POINTER(c_char), c_size_t, POINTER(c_size_t)],
    ),
    ("llm_detokenizer_flush", c_status, [p_detok, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    ("llm_detokenizer_free", None, [p_detok]),
    (
        "llm_chat_template_apply",
        c_status,
        [p_model, POINTER(ChatMessage), c_size_t, c_bool, POINTER(c_char), c_size_t,
         POINTER(c_size_t)],
    ),
    ("llm_chat_params_init_sized", None, [POINTER(ChatParams), c_size_t]),
    (
        "llm_chat_apply",
        c_status,
        [p_model, POINTER(ChatParams), POINTER(c_char), c_size_t, POINTER(c_size_t)],
    ),
    ("llm_model_chat_template", c_status, [p_model, c_char_p, POINTER(c_char_p)]),
    ("llm_session_params_init_sized", None, [POINTER(SessionParams), c_size_t]),
    ("llm_session_create", c_status, [p_model, POINTER(SessionParams), POINTER(p_session)]),
    ("llm_device_params_init_sized", None, [POINTER(DeviceParams), c_size_t]),
    (
        "llm_session_create_ex",
        c_status,
        [p_model, POINTER(SessionParams), POINTER(DeviceParams), POINTER(p_session)],
    ),
    ("llm_session_free", None, [p_session]),
    (
        "llm_session_last_error",
        c_status,
        [p_session, POINTER(c_status), POINTER(c_char), c_size_t, POINTER(c_size_t)],
    ),
    ("llm_session_interrupt", None, [p_session]),
    ("llm_sampling_params_init_sized", None, [POINTER(SamplingParams), c_size_t]),
    ("llm_generate_params_init_sized", None, [POINTER(GenerateParams), c_size_t]),
    (
        "llm_generate",
        c_status,
        [p_session, POINTER(c_token), c_size_t, POINTER(GenerateParams),
         POINTER(GenerateResult)],
    ),
    ("llm_request_params_init_sized", None, [POINTER(RequestParams), c_size_t]),
    (
        "llm_session_submit",
        c_status,
        [p_session, POINTER(c_token), c_size_t, POINTER(RequestParams), POINTER(c_request_id)],
    ),
    ("llm_session_cancel", c_status, [p_session, c_request_id]),
    (
        "llm_session_step",
        c_status,
        [p_session, POINTER(Event), c_size_t, c_size_t, POINTER(c_size_t)],
    ),
    ("llm_session_get_stats", c_status, [p_session, POINTER(SessionStats)]),
    # token level
    ("llm_seq_open", c_status, [p_session, POINTER(c_seq_id)]),
    ("llm_seq_fork", c_status, [p_session, c_seq_id, POINTER(c_seq_id)]),
    ("llm_seq_close", c_status, [p_session, c_seq_id]),
    ("llm_seq_truncate", c_status, [p_session, c_seq_id, c_uint32]),
    ("llm_seq_length", c_status, [p_session, c_seq_id, POINTER(c_uint32)]),
    ("llm_batch_create", c_status, [c_uint32, POINTER(p_batch)]),
    ("llm_batch_free", None, [p_batch]),
    ("llm_batch_clear", None, [p_batch]),
    ("llm_batch_add", c_status, [p_batch, c_seq_id, c_uint32, c_token, c_bool]),
    ("llm_session_decode", c_status, [p_session, p_batch]),
    ("llm_session_logits", c_status, [p_session, c_uint32, POINTER(POINTER(c_float))]),
    (
        "llm_seq_tokens",
        c_status,
        [p_session, c_seq_id, POINTER(c_token), c_size_t, POINTER(c_size_t)],
    ),
    ("llm_seq_state_save", c_status, [p_session, c_seq_id, c_void_p, c_size_t, POINTER(c_size_t)]),
    ("llm_seq_state_load", c_status, [p_session, c_void_p, c_size_t, POINTER(c_seq_id)]),
    ("llm_seq_state_save_file", c_status, [p_session, c_seq_id, c_char_p]),
    ("llm_seq_state_load_file", c_status, [p_session, c_char_p, POINTER(c_seq_id)]),
    ("llm_session_state_save", c_status, [p_session, c_void_p, c_size_t, POINTER(c_size_t)]),
    ("llm_session_state_load", c_status, [p_session, c_void_p, c_size_t]),
    ("llm_session_state_save_file", c_status, [p_session, c_char_p]),
    ("llm_session_state_load_file", c_status, [p_session, c_char_p]),
    (
        "llm_sampler_create",
        c_status,
        [p_model, POINTER(SamplingParams), c_uint64, POINTER(p_sampler)],
    ),
    ("llm_sampler_free", None, [p_sampler]),
    (
        "llm_sampler_sample",
        c_status,
        [p_sampler, POINTER(c_float), POINTER(c_token), c_size_t, c_uint32, c_uint64,
         POINTER(c_token)],
    ),
    (
        "llm_sampler_logprobs",
        c_status,
        [p_sampler, POINTER(c_float), c_uint32, POINTER(c_token), POINTER(c_float),
         POINTER(c_uint32)],
    ),
]


# Functions of newer API versions, declared where the library has them;
# ``has(name)`` tells. Embeddings: API 1.3.
_OPTIONAL_PROTOTYPES: List[Tuple[str, Any, List[Any]]] = [
    ("llm_embed_params_init_sized", None, [POINTER(EmbedParams), c_size_t]),
    ("llm_model_pooling", c_status, [p_model, POINTER(c_enum)]),
    (
        "llm_session_embed",
        c_status,
        [p_session, POINTER(POINTER(c_token)), POINTER(c_size_t), c_size_t,
         POINTER(EmbedParams), POINTER(c_float), c_size_t, POINTER(c_size_t)],
    ),
    # LoRA adapters: API 1.4.
    ("llm_adapter_params_init_sized", None, [POINTER(AdapterParams), c_size_t]),
    ("llm_adapter_load", c_status, [p_model, c_char_p, POINTER(AdapterParams), POINTER(c_void_p)]),
    ("llm_adapter_free", None, [c_void_p]),
    ("llm_seq_set_adapter", c_status, [p_session, c_seq_id, c_void_p, c_float]),
]
_present: Dict[str, bool] = {}


def has(name: str) -> bool:
    """Whether the loaded library exports the optional function ``name``."""
    return _present.get(name, False)


p_grammar = c_void_p
p_grammar_state = c_void_p
_COMPILE = [p_model, c_char_p, c_size_t, POINTER(GrammarParams), POINTER(p_grammar)]
# Grammars (1.3).
_PROTOTYPES += [
    ("llm_grammar_params_init_sized", None, [POINTER(GrammarParams), c_size_t]),
    ("llm_grammar_compile_json_schema", c_status, _COMPILE),
    ("llm_grammar_compile_ebnf", c_status, _COMPILE),
    ("llm_grammar_compile_regex", c_status, _COMPILE),
    ("llm_grammar_free", None, [p_grammar]),
    ("llm_grammar_state_create", c_status, [p_grammar, POINTER(p_grammar_state)]),
    ("llm_grammar_state_fork", c_status, [p_grammar_state, POINTER(p_grammar_state)]),
    ("llm_grammar_state_free", None, [p_grammar_state]),
    ("llm_grammar_state_accept_token", c_status, [p_grammar_state, c_token]),
    ("llm_grammar_state_fill_mask", c_status, [p_grammar_state, POINTER(c_uint32), c_size_t]),
    ("llm_grammar_state_can_end", c_status, [p_grammar_state, POINTER(c_bool)]),
    ("llm_grammar_state_is_complete", c_status, [p_grammar_state, POINTER(c_bool)]),
    ("llm_grammar_state_rollback", c_status, [p_grammar_state, c_uint32]),
]


def _declare() -> None:
    missing = []
    for name, restype, argtypes in _PROTOTYPES:
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
    for name, restype, argtypes in _OPTIONAL_PROTOTYPES:
        fn = getattr(lib, name, None)
        _present[name] = fn is not None
        if fn is not None:
            fn.restype = restype
            fn.argtypes = argtypes
    if missing:
        raise LibraryNotFoundError(
            f"the loaded libllminfer lacks {', '.join(missing)}: this binding needs "
            f"API {REQUIRED_MAJOR}.{REQUIRED_MINOR} or newer"
        )


def version_problem(number: int) -> Optional[str]:
    """Why a library of version ``number`` (LLM_VERSION_NUMBER) cannot serve."""
    major, minor = number // 10000, number // 100 % 100
    if major != REQUIRED_MAJOR or minor < REQUIRED_MINOR:
        return (
            f"libllminfer {major}.{minor}.{number % 100} is loaded; this binding "
            f"needs {REQUIRED_MAJOR}.x with x >= {REQUIRED_MINOR}"
        )
    return None


def _check_version() -> None:
    problem = version_problem(int(lib.llm_version_number()))
    if problem:
        raise LibraryNotFoundError(problem)


def layout_mismatches(structs: Optional[Dict[str, Type[Structure]]] = None) -> List[str]:
    """Every difference between the mirrored structs and the library's."""
    problems = []
    checked = dict(STRUCTS) if structs is None else structs
    if structs is None:
        for c_name, mirror in OPTIONAL_STRUCTS.items():
            if lib.llm_struct_size(c_name.encode()) != 0:
                checked[c_name] = mirror
    for c_name, mirror in checked.items():
        name = c_name.encode()
        size = lib.llm_struct_size(name)
        optional = OPTIONAL_FIELDS.get(c_name, ())
        absent = [f for f in optional if lib.llm_struct_offset(name, f.encode()) == SIZE_MAX]
        # Without its newer fields the struct ends before the first of them.
        fits = absent and size <= getattr(mirror, absent[0]).offset
        if size != ctypes.sizeof(mirror) and not fits:
            problems.append(
                f"sizeof({c_name}) is {size} in the library, {ctypes.sizeof(mirror)} here"
            )
        for field, *_ in mirror._fields_:
            if field in absent:
                continue
            offset = lib.llm_struct_offset(name, field.encode())
            ours = getattr(mirror, field).offset
            if offset != ours:
                theirs = "unknown" if offset == SIZE_MAX else str(offset)
                problems.append(f"offsetof({c_name}, {field}) is {theirs} in the library, {ours} here")
    return problems


def _check_layouts() -> None:
    problems = layout_mismatches()
    if problems:
        raise LibraryNotFoundError(
            "libllminfer's struct layouts differ from this binding's, refusing to use it: "
            + "; ".join(problems)
        )


_declare()
_check_version()
_check_layouts()


def version_string() -> str:
    return str(lib.llm_version_string().decode())


def version_number() -> int:
    return int(lib.llm_version_number())
