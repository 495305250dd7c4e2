"""Sessions: blocking generation, requests, stepping and interrupts."""

from __future__ import annotations

import ctypes
import signal
import threading
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Union,
)

from . import _native
from .adapter import Adapter
from ._closeable import Closeable
from ._handles import _SessionHandle
from ._native import lib
from .errors import (
    ClosedError,
    InternalError,
    InvalidArgumentError,
    LlmCancelledError,
    Status,
    check,
    error_for,
    thread_last_error,
)
from .model import ChatMessage, Model
from .embed import EmbedMixin
from .tokens import TokenLevelMixin
from .params import Event, FinishReason, GenerateResult, KvType, SamplingParams, SessionStats, SpecMode
from .request import Request, _RequestState

Prompt = Union[str, Sequence[int]]
"""Text (tokenized with the model's special tokens added and parsed, as
``llm-run`` does) or token ids."""

TokenCallback = Callable[[str], Optional[bool]]

_ERROR_CAPACITY = 1024
_EVENTS_PER_STEP = 64


class _CtrlCInterrupts:
    """Defers Ctrl-C to a safe point and interrupts the session meanwhile.

    Python runs signal handlers between bytecodes, such as inside the token
    callback of llm_generate; the default handler would raise
    KeyboardInterrupt on the callback's first line, where no ``try`` can
    catch it, and ctypes would swallow it. Between a step and the routing
    of its events it would lose the events. While the block runs, this
    handler only records the signal and interrupts the session; leaving the
    block raises KeyboardInterrupt (also in place of the LlmCancelledError
    of the interrupted call). Other SIGINT handlers are left alone, and
    threads other than the main one never receive signals.
    """

    def __init__(self, session: "Session") -> None:
        self._session = session
        self._previous: Any = None
        self.pressed = False

    def _on_sigint(self, _signum: int, _frame: Any) -> None:
        self.pressed = True
        self._session.interrupt()

    def __enter__(self) -> "_CtrlCInterrupts":
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, exc_type: Optional[type], *_exc_info: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        if self.pressed and (exc_type is None or issubclass(exc_type, LlmCancelledError)):
            raise KeyboardInterrupt


class Session(TokenLevelMixin, EmbedMixin, Closeable):
    """A runtime for one model: KV memory, threads and requests.

    ``Session(model, n_threads=..., n_ctx=..., ...)`` takes the fields of
    ``llm_session_params`` as keyword arguments; ``None`` keeps the
    library's default. ``device`` (``"cpu"``, ``"cuda"`` or ``"auto"``),
    ``tensor_parallel`` and ``devices`` (ids) choose where it runs
    (``llm_device_params``, experimental); a backend that is not available
    here raises :class:`UnsupportedError` saying why. One thread at a time steps a session (the binding
    serializes :meth:`generate`, :meth:`step` and request iteration with a
    lock); :meth:`submit`, :meth:`interrupt` and :meth:`Request.cancel`
    may be called from any thread.
    """

    def __init__(
        self,
        model: Model,
        *,
        n_threads: Optional[int] = None,
        n_ctx: Optional[int] = None,
        max_batch_tokens: Optional[int] = None,
        kv_cache_bytes: Optional[int] = None,
        kv_type: Optional[KvType] = None,
        kv_block_size: Optional[int] = None,
        prefix_cache: Optional[bool] = None,
        draft_model: Optional[Model] = None,
        device: Optional[str] = None,
        tensor_parallel: Optional[int] = None,
        devices: Optional[Sequence[int]] = None,
    ) -> None:
        self._handle_box: Optional[_SessionHandle] = None
        self.model = model
        self.draft_model = draft_model  # borrowed by the library: keep it alive
        # Only the queues, not the Request objects, so no cycle keeps a
        # session alive until the garbage collector runs.
        self._requests: Dict[int, "_RequestState"] = {}
        self._requests_lock = threading.Lock()

        params = _native.SessionParams()
        lib.llm_session_params_init_sized(ctypes.byref(params), ctypes.sizeof(params))
        given = {
            "n_threads": n_threads,
            "n_ctx": n_ctx,
            "max_batch_tokens": max_batch_tokens,
            "kv_cache_bytes": kv_cache_bytes,
            "kv_type": None if kv_type is None else int(kv_type),
            "kv_block_size": kv_block_size,
            "prefix_cache": prefix_cache,
        }
        for name, value in given.items():
            if value is not None:
                setattr(params, name, value)
        if draft_model is not None:
            params.draft_model = draft_model._handle()
        message = ctypes.create_string_buffer(_ERROR_CAPACITY)
        params.error_message = ctypes.cast(message, ctypes.POINTER(ctypes.c_char))
        params.error_capacity = _ERROR_CAPACITY
        out = _native.p_session()
        if device is None and tensor_parallel is None and devices is None:
            status = lib.llm_session_create(model._handle(), ctypes.byref(params),
                                            ctypes.byref(out))
        else:
            where = _native.DeviceParams()
            lib.llm_device_params_init_sized(ctypes.byref(where), ctypes.sizeof(where))
            if device is not None:
                where.backend = device.encode("utf-8")
            if tensor_parallel is not None:
                where.tensor_parallel = tensor_parallel
            ids = [int(d) for d in devices or ()]
            id_array = (ctypes.c_int32 * max(len(ids), 1))(*ids)
            if ids:
                where.devices = id_array
                where.n_devices = len(ids)
            status = lib.llm_session_create_ex(model._handle(), ctypes.byref(params),
                                               ctypes.byref(where), ctypes.byref(out))
        check(status, lambda: message.value.decode("utf-8", "replace"))

        models = [model] if draft_model is None else [model, draft_model]
        assert out.value is not None
        handle = _SessionHandle(out.value, models)
        self._handle_box = handle
        try:
            for m in models:
                m._attach(handle)
        except BaseException:
            handle.free()
            raise

    # --- lifetime ---------------------------------------------------------

    def close(self) -> None:
        """Frees the session and its requests; closing twice is harmless."""
        if self._handle_box is not None:
            self._handle_box.free()

    @property
    def closed(self) -> bool:
        return self._handle_box is None or self._handle_box.ptr is None

    def _ptr(self) -> int:
        box = self._handle_box
        ptr = None if box is None else box.ptr
        if ptr is None:
            raise ClosedError("session")
        return ptr

    def _stepping_box(self) -> _SessionHandle:
        """The handle, for a call that steps; refuses a nested one."""
        self._ptr()
        box = self._handle_box
        assert box is not None
        if box.stepping_thread == threading.get_ident():
            raise InvalidArgumentError(
                Status.INVALID_ARGUMENT,
                "the session cannot be stepped from inside its own on_token callback",
            )
        return box

    def _session_message(self, ptr: int, failed: int) -> str:
        """The failure's message: the session's own record when it is this
        failure's, else this thread's (another thread's failure on the same
        session may have overwritten the record in between)."""
        status = _native.c_status(0)
        need = ctypes.c_size_t(0)
        buf = ctypes.create_string_buffer(_ERROR_CAPACITY)
        lib.llm_session_last_error(ptr, ctypes.byref(status), buf, _ERROR_CAPACITY,
                                   ctypes.byref(need))
        if status.value == failed and buf.value:
            return buf.value.decode("utf-8", "replace")
        return thread_last_error()

    def _check(self, ptr: int, status: int) -> None:
        if status != Status.OK:
            raise error_for(status, self._session_message(ptr, status))

    def _prompt_tokens(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            return self.model.tokenize(prompt, add_special=True, parse_special=True)
        return [int(t) for t in prompt]

    # --- blocking generation ----------------------------------------------

    def generate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: Optional[int] = None,
        sampling: Optional[SamplingParams] = None,
        ignore_eos: bool = False,
        spec_mode: Optional[SpecMode] = None,
        spec_k: Optional[int] = None,
        on_token: Optional[TokenCallback] = None,
        adapter: Optional[Adapter] = None,
        adapter_scale: float = 1.0,
    ) -> GenerateResult:
        """Generates a continuation of ``prompt`` and returns it whole.

        ``sampling=None`` is greedy. ``on_token(piece)`` runs on this thread
        for every token; returning ``False`` stops. An exception it raises
        stops generation and is re-raised here once the library has
        returned; so is Ctrl-C, as ``KeyboardInterrupt`` (on the main
        thread, while Python's default SIGINT handler is installed).
        :meth:`interrupt` from another thread or a signal handler stops it
        too: the result then has ``finish_reason ==
        FinishReason.CANCELLED``. ``adapter`` (an :class:`Adapter` of this
        session's model) runs the request with that LoRA adapter at
        ``adapter_scale``.
        """
        tokens_in = self._prompt_tokens(prompt)
        prompt_array = (_native.c_token * max(len(tokens_in), 1))(*tokens_in)
        params = _native.GenerateParams()
        lib.llm_generate_params_init_sized(ctypes.byref(params), ctypes.sizeof(params))
        if max_new_tokens is not None:
            params.max_new_tokens = max_new_tokens
        params.ignore_eos = ignore_eos
        if spec_mode is not None:
            params.spec_mode = int(spec_mode)
        if spec_k is not None:
            params.spec_k = spec_k
        if adapter is not None:
            params.adapter = adapter._handle()
            params.adapter_scale = adapter_scale
        keep_alive: Any = None
        if sampling is not None:
            raw_sampling, keep_alive = sampling._to_c()
            params.sampling = ctypes.pointer(raw_sampling)

        pieces: List[str] = []
        tokens_out: List[int] = []
        raised: List[BaseException] = []

        def deliver(token: int, piece: Any, length: int, _user: Any) -> bool:
            # Nothing may unwind through the library: any exception stops
            # generation and is raised again after llm_generate returns.
            try:
                text = ctypes.string_at(piece, length).decode("utf-8", "replace") if length else ""
                if token != -1:
                    tokens_out.append(token)
                pieces.append(text)
                if on_token is not None and on_token(text) is False:
                    return False
                return True
            except BaseException as exc:  # noqa: B036 - KeyboardInterrupt included
                raised.append(exc)
                return False

        callback = _native.TOKEN_FN(deliver)
        params.on_token = callback
        result = _native.GenerateResult()
        result.struct_size = ctypes.sizeof(result)

        box = self._stepping_box()
        with box.lock, _CtrlCInterrupts(self) as ctrl_c:
            ptr = self._ptr()
            box.stepping_thread = threading.get_ident()
            try:
                status = lib.llm_generate(ptr, prompt_array, len(tokens_in), ctypes.byref(params),
                                          ctypes.byref(result))
            finally:
                box.stepping_thread = None
            message = "" if status in (Status.OK, Status.CANCELLED) else self._session_message(ptr, status)
        del keep_alive, callback
        if raised:
            raise raised[0]
        if status not in (Status.OK, Status.CANCELLED):
            raise error_for(status, message)
        return GenerateResult(
            text="".join(pieces),
            tokens=tuple(tokens_out),
            finish_reason=FinishReason(result.finish_reason)
            if status == Status.OK else FinishReason.CANCELLED,
            n_prompt_tokens=result.n_prompt_tokens,
            n_generated_tokens=result.n_generated_tokens,
            prompt_seconds=result.prompt_seconds,
            generate_seconds=result.generate_seconds,
            n_spec_steps=result.n_spec_steps,
            n_draft_tokens=result.n_draft_tokens,
            n_accepted_tokens=result.n_accepted_tokens,
        )

    def interrupt(self) -> None:
        """Stops the generate or step running on this session, from any thread.

        It only sets an atomic flag in the library, so a signal handler may
        call it. When nothing runs it has no effect.
        """
        box = self._handle_box
        ptr = None if box is None else box.ptr
        if ptr is not None:
            lib.llm_session_interrupt(ptr)

    # --- requests -----------------------------------------------------------

    def submit(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: Optional[int] = None,
        sampling: Optional[SamplingParams] = None,
        priority: Optional[int] = None,
        ignore_eos: Optional[bool] = None,
        logprobs: Optional[bool] = None,
        stop_tokens: Iterable[int] = (),
        stop_strings: Iterable[str] = (),
        top_logprobs: Optional[int] = None,
        spec_mode: Optional[SpecMode] = None,
        spec_k: Optional[int] = None,
        n_samples: Optional[int] = None,
        adapter: Optional[Adapter] = None,
        adapter_scale: float = 1.0,
    ) -> "Request":
        """Queues a request (``llm_session_submit``); thread-safe.

        Iterate the returned :class:`Request` for its events; the session
        advances every request in the same steps.
        """
        tokens_in = self._prompt_tokens(prompt)
        prompt_array = (_native.c_token * max(len(tokens_in), 1))(*tokens_in)
        params = _native.RequestParams()
        lib.llm_request_params_init_sized(ctypes.byref(params), ctypes.sizeof(params))
        plain = {
            "max_new_tokens": max_new_tokens,
            "priority": priority,
            "ignore_eos": ignore_eos,
            "logprobs": logprobs,
            "top_logprobs": top_logprobs,
            "spec_mode": None if spec_mode is None else int(spec_mode),
            "spec_k": spec_k,
            "n_samples": n_samples,
        }
        for name, value in plain.items():
            if value is not None:
                setattr(params, name, value)
        if adapter is not None:
            params.adapter = adapter._handle()
            params.adapter_scale = adapter_scale
        keep_alive: List[Any] = []
        if sampling is not None:
            raw_sampling, bias = sampling._to_c()
            keep_alive += [raw_sampling, bias]
            params.sampling = ctypes.pointer(raw_sampling)
        stops = [int(t) for t in stop_tokens]
        if stops:
            stop_array = (_native.c_token * len(stops))(*stops)
            keep_alive.append(stop_array)
            params.stop_tokens = stop_array
            params.n_stop_tokens = len(stops)
        texts = [s.encode("utf-8") for s in stop_strings]
        if texts:
            text_array = (ctypes.c_char_p * len(texts))(*texts)
            keep_alive.append(text_array)
            params.stop_strings = text_array
            params.n_stop_strings = len(texts)

        ptr = self._ptr()
        request_id = _native.c_request_id(0)
        # Registered under the lock before the id can show up in a step.
        with self._requests_lock:
            status = lib.llm_session_submit(ptr, prompt_array, len(tokens_in), ctypes.byref(params),
                                            ctypes.byref(request_id))
            self._check(ptr, status)
            request = Request(self, request_id.value, max(1, params.n_samples))
            request._adapter = adapter  # the library borrows it until the request ends
            self._requests[request.id] = request._state
        return request

    def _cancel(self, request_id: int) -> int:
        return int(lib.llm_session_cancel(self._ptr(), request_id))

    def step(self, max_events: int = _EVENTS_PER_STEP) -> List[Event]:
        """Runs one scheduler iteration (or delivers leftover events).

        The events also reach the iterators of the requests they belong to.
        An empty list with :attr:`SessionStats.n_running` and ``n_waiting``
        both zero means the session is idle.
        """
        box = self._stepping_box()
        with box.lock, _CtrlCInterrupts(self):
            return self._step_locked(max_events)

    def _step_locked(self, max_events: int) -> List[Event]:
        ptr = self._ptr()
        capacity = max(1, max_events)
        raw = (_native.Event * capacity)()
        count = ctypes.c_size_t(0)
        status = lib.llm_session_step(ptr, raw, capacity, ctypes.sizeof(_native.Event),
                                      ctypes.byref(count))
        self._check(ptr, status)
        # Text is borrowed until the next step: copy before anything else runs.
        events = [Event._from_c(raw[i]) for i in range(count.value)]
        self._route(events)
        return events

    def _route(self, events: List[Event]) -> None:
        with self._requests_lock:
            for event in events:
                state = self._requests.get(event.request_id)
                if state is None:
                    continue
                if state.accept(event):
                    del self._requests[event.request_id]

    def _advance(self, request: "Request") -> None:
        """Steps until ``request`` has an event queued or is finished."""
        box = self._stepping_box()
        with box.lock, _CtrlCInterrupts(self) as ctrl_c:
            while not request._state.has_news() and not ctrl_c.pressed:
                if self._step_locked(_EVENTS_PER_STEP):
                    continue
                stats = self.stats()
                if stats.n_running == 0 and stats.n_waiting == 0 and not request._state.has_news():
                    raise InternalError(
                        Status.INTERNAL,
                        f"the session is idle but request {request.id} never finished",
                    )

    def stream(self, prompt: Prompt, **request_params: Any) -> Iterator[str]:
        """Submits a request and yields its text piece by piece.

        Takes :meth:`submit`'s keyword arguments. Leaving the loop early,
        an exception or Ctrl-C (``KeyboardInterrupt`` between steps) cancels
        the request. A request that ends in error raises :class:`LlmError`.
        """
        request = self.submit(prompt, **request_params)
        with request:
            for event in request:
                if event.text:
                    yield event.text
                request._raise_if_failed(event)

    def create_chat_completion(self, messages: Iterable[ChatMessage],
                               **kwargs: Any) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
        """A chat completion shaped as OpenAI's ``chat.completions.create``.

        ``messages`` are ``{"role": ..., "content": ...}`` dicts (or pairs),
        rendered with the model's chat template. Keyword arguments, all
        optional: ``max_tokens`` (or ``max_completion_tokens``),
        ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``,
        ``presence_penalty``, ``frequency_penalty``, ``logit_bias``,
        ``stop`` (a string or a list), ``n`` and ``model`` (the name put in
        the result; default the file's). Without any sampling argument the
        choice is greedy. Returns a ``chat.completion`` dict (``choices``
        with ``message`` and ``finish_reason``, ``usage``), or with
        ``stream=True`` an iterator of ``chat.completion.chunk`` dicts: the
        role, content deltas, then the finish reason. Leaving the iteration
        early cancels the request.
        """
        from .chat import create_chat_completion

        return create_chat_completion(self, messages, **kwargs)

    chat = create_chat_completion

    def astream(self, prompt: Prompt, **request_params: Any) -> AsyncIterator[str]:
        """:meth:`stream` for asyncio: steps run in a worker thread, and
        cancelling the task cancels the request."""
        from .aio import stream_text

        return stream_text(self, self.submit(prompt, **request_params))

    def stats(self) -> SessionStats:
        raw = _native.SessionStats()
        raw.struct_size = ctypes.sizeof(raw)
        ptr = self._ptr()
        self._check(ptr, lib.llm_session_get_stats(ptr, ctypes.byref(raw)))
        return SessionStats._from_c(raw)

    def last_error(self) -> Optional[Exception]:
        """The session's last failure (``llm_session_last_error``), or None."""
        ptr = self._ptr()
        status = _native.c_status(0)
        need = ctypes.c_size_t(0)
        buf = ctypes.create_string_buffer(_ERROR_CAPACITY)
        check(lib.llm_session_last_error(ptr, ctypes.byref(status), buf, _ERROR_CAPACITY,
                                         ctypes.byref(need)))
        if status.value == Status.OK:
            return None
        return error_for(status.value, buf.value.decode("utf-8", "replace"))

    def __repr__(self) -> str:
        return f"<llminfer.Session {'closed' if self.closed else 'open'} on {self.model!r}>"
