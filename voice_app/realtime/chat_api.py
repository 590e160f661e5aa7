"""OpenAI's text API on the voice server's own engine: `POST /v1/chat/completions` (streamed as
Server-Sent Events or not), `GET /v1/models`, `GET /v1/models/{id}`. docs/api.md is the contract.

Each choice is one foreground engine request, batched with the voice sessions' requests. A
client that leaves (mid-stream or while waiting for a whole reply) cancels its requests, which
leave the engine before its next step."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from dllm_engine.request import EngineError, EngineOverloaded, GenerationParams
from voice_app.core.metrics import VoiceMetrics
from voice_app.core.offload import submit_off_loop
from voice_app.realtime.chat_choice import ChoiceEvent, ChoiceFailed, follow_choice
from voice_app.realtime.chat_request import ApiError, ChatRequest, bad_request, parse_chat_request
from voice_app.settings import Settings

log = logging.getLogger(__name__)

# room the engine needs past the reply: one decoding block (at most 256 tokens) and one position
DECODER_RESERVE = 257
RETRY_AFTER_S = 1
OWNER = "dllm-voice"


class ChatApi:
    def __init__(self, engine: Any, settings: Settings, metrics: VoiceMetrics):
        self.engine = engine
        self.settings = settings  # engine_mode, max_message_bytes, context_tokens, max_output_tokens_cap, ...
        self.created = int(time.time())
        self.completed = metrics.add_counter("voice_chat_completions_total", "Chat completions answered in full")
        self.abandoned = metrics.add_counter(
            "voice_chat_completions_abandoned_total", "Chat completions cancelled because the client left")
        self.overloaded = metrics.add_counter(
            "voice_chat_completions_overloaded_total", "Chat completions refused with 429 (engine at its limits)")

    def routes(self) -> list[Route]:
        return [
            Route("/v1/models", self.list_models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.get_model, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
        ]

    # ---- /v1/models ----------------------------------------------------------------------------
    def model_card(self) -> dict[str, Any]:
        return {"id": self.engine.model_name, "object": "model", "created": self.created, "owned_by": OWNER}

    async def list_models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def get_model(self, request: Request) -> JSONResponse:
        try:
            self.check_model(request.path_params["model_id"])
        except ApiError as error:
            return error_response(error)
        return JSONResponse(self.model_card())

    def check_model(self, model: str) -> None:
        if model != self.engine.model_name:
            raise ApiError(404, f"The model `{model}` does not exist on this server; it serves "
                                f"`{self.engine.model_name}` (GET /v1/models)", "model", "model_not_found")

    # ---- /v1/chat/completions ------------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        try:
            raw = await read_body(request, self.settings.max_message_bytes)
            # parsing, the chat template and tokenizing take seconds for a huge body: off the loop
            submitted = await submit_off_loop(lambda: self.submit(raw))
        except ApiError as error:
            return error_response(error)
        reply = Reply(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), self.engine.model_name, submitted.chat,
                      submitted.prompt_tokens, self.engine_mode)
        if submitted.chat.stream:
            return EngineStream(self.stream(reply, submitted), submitted, media_type="text/event-stream",
                                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self.whole_reply(request, reply, submitted)

    @property
    def engine_mode(self) -> str:
        """The mode replies run in ("auto" resolved to what the engine measured faster)."""
        mode = self.settings.engine_mode
        return getattr(self.engine, "auto_mode", mode) if mode == "auto" else mode

    def submit(self, raw: bytes) -> "Submitted":
        chat = parse_chat_request(raw, self.settings.max_output_tokens_cap)
        self.check_model(chat.model)
        prompt_tokens = self.count_tokens(chat.messages)
        return Submitted(chat, prompt_tokens, self.engine_requests(chat, self.max_new_tokens(chat, prompt_tokens)))

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        try:
            return self.engine.count_tokens(messages)
        except EngineError as exc:  # e.g. the chat template refuses the conversation
            raise bad_request(f"the messages cannot be rendered for this model: {exc}", "messages") from None

    def max_new_tokens(self, chat: ChatRequest, prompt_tokens: int) -> int:
        """The client's max_tokens, or as many as fit (up to the cap), within the server's context."""
        context = min(self.settings.context_tokens, self.engine.max_context_tokens)
        limit = (f"this server's context limit is {context} tokens (its context_tokens setting; the model's "
                 f"is {self.engine.max_context_tokens})")
        if prompt_tokens >= context:
            raise ApiError(400, f"The messages are {prompt_tokens} tokens long: {limit}", "messages",
                           "context_length_exceeded")
        if chat.max_tokens is None:
            return max(1, min(self.settings.max_output_tokens_cap, context - prompt_tokens - DECODER_RESERVE))
        if prompt_tokens + chat.max_tokens > context:
            raise ApiError(400, f"You requested {prompt_tokens + chat.max_tokens} tokens ({prompt_tokens} in the "
                                f"messages, {chat.max_tokens} in the completion), but {limit}", "messages",
                           "context_length_exceeded")
        return chat.max_tokens

    def engine_requests(self, chat: ChatRequest, max_new_tokens: int) -> list[Any]:
        """One engine request per choice; all of them or none."""
        handles: list[Any] = []
        try:
            for index in range(chat.n):
                seed = None if chat.seed is None else chat.seed + index  # n samples, not n copies
                params = GenerationParams(max_new_tokens=max_new_tokens, mode=self.settings.engine_mode,
                                          temperature=chat.temperature, seed=seed, deadline_s=chat.deadline_s)
                handles.append(self.engine.submit(chat.messages, params))
        except EngineOverloaded as exc:
            cancel(handles)
            self.overloaded.inc()
            raise ApiError(429, f"The engine is at its limits ({exc}); retry in {RETRY_AFTER_S} s", None,
                           "engine_overloaded", "rate_limit_error", {"Retry-After": str(RETRY_AFTER_S)}) from None
        except EngineError as exc:
            cancel(handles)
            raise bad_request(f"the engine refused the request: {exc}") from None
        return handles

    def follow(self, submitted: "Submitted") -> list[AsyncIterator[ChoiceEvent]]:
        timeout_s = self.settings.response_inactivity_timeout_s
        return [follow_choice(index, handle, submitted.chat.stop, timeout_s)
                for index, handle in enumerate(submitted.handles)]

    async def whole_reply(self, request: Request, reply: "Reply", submitted: "Submitted") -> Response:
        answer = asyncio.ensure_future(asyncio.gather(*(collect(choice) for choice in self.follow(submitted))))
        gone = asyncio.ensure_future(client_gone(request))
        try:
            await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not answer.done():
                self.abandoned.inc()
                return Response(status_code=499)  # nobody reads it: the client closed the connection
            choices = answer.result()
        except ChoiceFailed as exc:
            return error_response(engine_failed(reply, exc))
        finally:
            gone.cancel()
            answer.cancel()
            submitted.cancel()
        self.completed.inc()
        return JSONResponse(reply.completion(choices))

    async def stream(self, reply: "Reply", submitted: "Submitted") -> AsyncIterator[str]:
        outcome = "abandoned"  # unless the loop below gets to its end: the client left
        try:
            for index in range(reply.chat.n):
                yield sse(reply.chunk([{"index": index, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}]))
            async for event in merged(self.follow(submitted)):
                for choice in reply.stream_choices(event):
                    yield sse(reply.chunk([choice]))
            outcome = "completed"
            if reply.chat.include_usage:
                yield sse(reply.chunk([], usage=reply.usage()))
        except ChoiceFailed as exc:
            outcome = "failed"
            yield sse(engine_failed(reply, exc).body())  # the SDKs raise an APIError on an `error` event
        finally:
            submitted.cancel()
            if outcome == "completed":
                self.completed.inc()
            elif outcome == "abandoned":
                self.abandoned.inc()
        yield "data: [DONE]\n\n"


@dataclass
class Submitted:
    """A validated request and its engine requests, one per choice."""

    chat: ChatRequest
    prompt_tokens: int
    handles: list[Any]

    def cancel(self) -> None:
        cancel(self.handles)


@dataclass
class Reply:
    """One completion's identity and accounting; builds its OpenAI-shaped bodies."""

    id: str
    created: int
    model: str
    chat: ChatRequest
    prompt_tokens: int
    engine_mode: str
    completion_tokens: int = 0

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> dict[str, Any]:
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}
        if self.chat.include_usage:
            body["usage"] = usage  # null on every chunk but the last, as OpenAI
        return body

    def stream_choices(self, event: ChoiceEvent) -> list[dict[str, Any]]:
        """A content delta, then (on the last event) a chunk with the finish reason and x_dllm."""
        choices = []
        if event.delta:
            choices.append({"index": event.index, "delta": {"content": event.delta}, "logprobs": None,
                            "finish_reason": None})
        if event.finish_reason:
            self.completion_tokens += event.stats.new_tokens
            choices.append({"index": event.index, "delta": {}, "logprobs": None,
                            "finish_reason": event.finish_reason, "x_dllm": self.x_dllm(event)})
        return choices

    def completion(self, choices: list[list[ChoiceEvent]]) -> dict[str, Any]:
        self.completion_tokens = sum(events[-1].stats.new_tokens for events in choices)
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": [self.message_choice(events) for events in choices],
                "usage": self.usage()}

    def message_choice(self, events: list[ChoiceEvent]) -> dict[str, Any]:
        last = events[-1]
        return {"index": last.index, "logprobs": None, "finish_reason": last.finish_reason,
                "message": {"role": "assistant", "content": "".join(e.delta for e in events), "refusal": None},
                "x_dllm": self.x_dllm(last)}

    def x_dllm(self, last: ChoiceEvent) -> dict[str, Any]:
        """Our addition to a finished choice: the engine's statistics of its request."""
        stats = last.stats
        return {"mode": self.engine_mode, "new_tokens": stats.new_tokens, "forward_passes": stats.forward_passes,
                "tokens_per_forward": round(stats.tokens_per_forward, 3),
                "cached_prompt_tokens": stats.cached_prompt_tokens, "elapsed_s": round(stats.elapsed_s, 4),
                "first_token_s": None if stats.first_token_s is None else round(stats.first_token_s, 4),
                "passes_to_first_token": last.passes_to_first_token,
                "deadline_s": self.chat.deadline_s, "deadline_met": stats.deadline_met}

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


async def read_body(request: Request, limit: int) -> bytes:
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise ApiError(413, f"the request body is over this server's limit of {limit} bytes", None,
                           "request_too_large")
    return bytes(body)


class EngineStream(StreamingResponse):
    """A streamed reply whose engine requests end the moment the client leaves. Starlette notices
    a disconnect by listening for it only under ASGI spec < 2.4; from 2.4 on, only when a chunk
    fails to send, and a reply waiting on the engine (a long prefill ahead of it, text held back
    by a stop sequence) sends nothing for a while. So the disconnect is watched here, whatever
    the server: the requests are cancelled at once and leave the engine before its next step."""

    def __init__(self, body: AsyncIterator[str], submitted: "Submitted", **kwargs: Any):
        super().__init__(body, **kwargs)
        self._submitted = submitted

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def cancel_when_gone() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self._submitted.cancel()  # a finished request ignores it

        watcher = asyncio.ensure_future(cancel_when_gone())
        try:
            await super().__call__(scope, receive, send)
        finally:
            watcher.cancel()
            self._submitted.cancel()


async def client_gone(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect(events: AsyncIterator[ChoiceEvent]) -> list[ChoiceEvent]:
    return [event async for event in events]


async def merged(streams: list[AsyncIterator[ChoiceEvent]]) -> AsyncIterator[ChoiceEvent]:
    """The events of every choice as they come (n > 1 streams its choices interleaved)."""
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(stream: AsyncIterator[ChoiceEvent]) -> None:
        try:
            async for event in stream:
                queue.put_nowait(event)
        except ChoiceFailed as exc:
            queue.put_nowait(exc)
        queue.put_nowait(end)

    tasks = [asyncio.ensure_future(pump(stream)) for stream in streams]
    try:
        for _ in tasks:
            while (item := await queue.get()) is not end:
                if isinstance(item, ChoiceFailed):
                    raise item
                yield item
    finally:
        for task in tasks:
            task.cancel()


def cancel(handles: list[Any]) -> None:
    for handle in handles:
        handle.cancel()  # a finished request ignores it


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def engine_failed(reply: Reply, exc: ChoiceFailed) -> ApiError:
    log.warning("chat completion %s failed: %s", reply.id, exc)
    return ApiError(500, f"the engine failed on this request: {exc}", None, "engine_error", "server_error")


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)
