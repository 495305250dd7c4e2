"""LoRA adapters (API 1.4): low-rank fine-tunes of a model, applied per
request (docs/lora.md).

    adapter = llminfer.Adapter(model, "my-lora.gguf")   # or a PEFT folder
    session.generate("Hello", adapter=adapter, adapter_scale=0.5)
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Optional, Union

from . import _native
from ._closeable import Closeable
from ._native import has, lib
from .errors import ClosedError, UnsupportedError, check


class Adapter(Closeable):
    """A LoRA adapter loaded for ``model`` (a llama.cpp LoRA GGUF or a
    Hugging Face PEFT folder); read-only, shareable by any number of
    requests and sessions of that model. It keeps the model alive, and
    requests that use it keep it alive until they end."""

    def __init__(self, model: Any, path: Union[str, "os.PathLike[str]"], use_mmap: bool = True) -> None:
        self._ptr: Optional[int] = None
        if not has("llm_adapter_load"):
            raise UnsupportedError("this libllminfer has no LoRA adapters (API 1.4 adds them)")
        self.model = model
        params = _native.AdapterParams()
        lib.llm_adapter_params_init_sized(ctypes.byref(params), ctypes.sizeof(params))
        params.use_mmap = use_mmap
        out = ctypes.c_void_p()
        check(lib.llm_adapter_load(model._handle(), os.fsencode(path), ctypes.byref(params),
                                   ctypes.byref(out)))
        self._ptr = out.value

    def _handle(self) -> int:
        if self._ptr is None:
            raise ClosedError("the adapter is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        """Frees the adapter; no request may still be using it."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            lib.llm_adapter_free(ptr)
