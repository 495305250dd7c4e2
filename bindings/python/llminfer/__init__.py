"""Python bindings of libllminfer, through ctypes.

    import llminfer
    with llminfer.Model("model.gguf") as model, llminfer.Session(model) as session:
        for piece in session.stream("Once upon a time", max_new_tokens=32):
            print(piece, end="", flush=True)

The shared library is found through the ``LLMINFER_LIBRARY`` environment
variable (a full path), else the dynamic loader's search for
``libllminfer.so.1``. Importing refuses a library older than API 1.2 or one
whose struct layouts differ from this binding's.
"""

from ._native import LibraryNotFoundError, version_number, version_string
from .errors import (
    BackendError,
    BadFormatError,
    BufferTooSmallError,
    ClosedError,
    InternalError,
    InvalidArgumentError,
    InvalidUtf8Error,
    LimitError,
    LlmCancelledError,
    LlmError,
    LlmIOError,
    NotFoundError,
    OutOfMemoryError,
    Status,
    UnsupportedError,
    status_description,
    status_name,
)
from .adapter import Adapter
from .embed import Pooling, model_pooling
from .grammar import Grammar, GrammarState
from .log import set_log_handler
from .model import ChatMessage, Detokenizer, Model, ModelInfo, TokenizeFlag
from .params import (
    Event,
    FinishReason,
    GenerateResult,
    KvType,
    LogLevel,
    SamplingParams,
    SessionStats,
    SpecMode,
)
from .request import Request
from .session import Prompt, Session
from .tokens import Batch, Sampler, TokenSequence

__version__ = "1.2.0"

__all__ = [
    "Adapter",
    "BackendError",
    "Batch",
    "Pooling",
    "model_pooling",
    "BadFormatError",
    "BufferTooSmallError",
    "ChatMessage",
    "ClosedError",
    "Detokenizer",
    "Event",
    "FinishReason",
    "GenerateResult",
    "Grammar",
    "GrammarState",
    "InternalError",
    "InvalidArgumentError",
    "InvalidUtf8Error",
    "KvType",
    "LibraryNotFoundError",
    "LimitError",
    "LlmCancelledError",
    "LlmError",
    "LlmIOError",
    "LogLevel",
    "Model",
    "ModelInfo",
    "NotFoundError",
    "OutOfMemoryError",
    "Prompt",
    "Request",
    "Sampler",
    "SamplingParams",
    "Session",
    "SessionStats",
    "SpecMode",
    "Status",
    "TokenSequence",
    "TokenizeFlag",
    "UnsupportedError",
    "set_log_handler",
    "status_description",
    "status_name",
    "version_number",
    "version_string",
]
