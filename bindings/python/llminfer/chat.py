"""OpenAI-shaped chat completions on a :class:`Session`.

``Session.create_chat_completion(messages, ...)`` (also ``Session.chat``)
takes the arguments of OpenAI's ``chat.completions.create`` that mean
something here and returns the same dicts: a ``chat.completion`` or, with
``stream=True``, an iterator of ``chat.completion.chunk`` dicts. The
prompt is the model's own chat template (:meth:`Model.apply_chat_template`).
"""

import os
import time
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

from .errors import InvalidArgumentError, Status
from .model import ChatMessage
from .params import Event, FinishReason, SamplingParams

_FINISH = {
    FinishReason.EOS: "stop",
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    # Not an OpenAI value: the request was cancelled (Request.cancel, interrupt).
    FinishReason.CANCELLED: "cancelled",
}


def _sampling(temperature: Optional[float], top_p: Optional[float], top_k: Optional[int],
              min_p: Optional[float], seed: Optional[int], presence_penalty: Optional[float],
              frequency_penalty: Optional[float],
              logit_bias: Optional[Mapping[Union[int, str], float]]) -> Optional[SamplingParams]:
    """SamplingParams from OpenAI's names; None (greedy) when none is given."""
    given = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "seed": seed,
        "presence_penalty": presence_penalty,
        "frequency_penalty": frequency_penalty,
    }
    fields = {name: value for name, value in given.items() if value is not None}
    if logit_bias:
        # OpenAI's JSON has the token ids as strings.
        fields["logit_bias"] = {int(token): float(bias) for token, bias in logit_bias.items()}
    return SamplingParams(**fields) if fields else None


def _stops(stop: Union[None, str, Sequence[str]]) -> List[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    return [str(s) for s in stop]


def _finish_reason(request: Any, event: Event) -> str:
    request._raise_if_failed(event)  # FinishReason.ERROR: the status's LlmError
    return _FINISH.get(event.finish_reason, "stop")


def create_chat_completion(
    session: Any,
    messages: Iterable[ChatMessage],
    *,
    model: Optional[str] = None,
    max_tokens: Optional[int] = None,
    max_completion_tokens: Optional[int] = None,
    temperature: Optional[float] = None,
    top_p: Optional[float] = None,
    top_k: Optional[int] = None,
    min_p: Optional[float] = None,
    seed: Optional[int] = None,
    presence_penalty: Optional[float] = None,
    frequency_penalty: Optional[float] = None,
    logit_bias: Optional[Mapping[Union[int, str], float]] = None,
    stop: Union[None, str, Sequence[str]] = None,
    n: int = 1,
    stream: bool = False,
) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
    """See :meth:`Session.create_chat_completion`."""
    if n < 1:
        raise InvalidArgumentError(Status.INVALID_ARGUMENT, f"n must be at least 1, not {n}")
    limit = max_completion_tokens if max_completion_tokens is not None else max_tokens
    text = session.model.apply_chat_template(list(messages), add_generation_prompt=True)
    prompt = session.model.tokenize(text, add_special=True, parse_special=True)
    request = session.submit(
        prompt,
        max_new_tokens=limit,
        sampling=_sampling(temperature, top_p, top_k, min_p, seed, presence_penalty,
                           frequency_penalty, logit_bias),
        stop_strings=_stops(stop),
        n_samples=n,
    )
    head = {
        "id": "chatcmpl-" + os.urandom(12).hex(),
        "created": int(time.time()),
        "model": model if model is not None else os.path.basename(str(session.model.path)),
        "system_fingerprint": None,
    }
    if stream:
        return _stream(request, head, n)
    return _complete(request, head, n, len(prompt))


def _complete(request: Any, head: Dict[str, Any], n: int, n_prompt: int) -> Dict[str, Any]:
    pieces: List[List[str]] = [[] for _ in range(n)]
    finish: List[Optional[str]] = [None] * n
    completion_tokens = 0
    with request:
        for event in request:
            # The end-of-turn token that ends a reply is not part of it (as
            # in llm-serve and Session.generate).
            if event.token is not None and event.finish_reason != FinishReason.EOS:
                completion_tokens += 1
            pieces[event.sample_index].append(event.text)
            if event.finished:
                finish[event.sample_index] = _finish_reason(request, event)
    choices = [{
        "index": i,
        "message": {"role": "assistant", "content": "".join(pieces[i])},
        "logprobs": None,
        "finish_reason": finish[i],
    } for i in range(n)]
    return dict(head, object="chat.completion", choices=choices, usage={
        "prompt_tokens": n_prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": n_prompt + completion_tokens,
    })


def _stream(request: Any, head: Dict[str, Any], n: int) -> Iterator[Dict[str, Any]]:
    """Chunks as OpenAI streams them: the role first, then content deltas,
    then an empty delta with the finish reason, per choice."""

    def chunk(index: int, delta: Dict[str, Any], finish: Optional[str] = None) -> Dict[str, Any]:
        return dict(head, object="chat.completion.chunk", choices=[{
            "index": index, "delta": delta, "logprobs": None, "finish_reason": finish}])

    started = [False] * n
    with request:
        for event in request:
            i = event.sample_index
            if not started[i]:
                started[i] = True
                yield chunk(i, {"role": "assistant", "content": ""})
            if event.text:
                yield chunk(i, {"content": event.text})
            if event.finished:
                yield chunk(i, {}, _finish_reason(request, event))
