"""OpenAI's text API on the real server (free port, real engine and default model), through the
official openai SDK: /v1/models, /v1/chat/completions whole and streamed, errors, cancellation."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from dllm_engine.request import DraftUpdate, EngineOverloaded, GenerationParams, RequestHandle
from voice_app.settings import DEFAULT_INSTRUCTIONS
from voice_app.speech.loaded_models import LoadedModels

pytestmark = pytest.mark.slow

# with a system message, as clients send one: the voice app's own instructions. Without one, or
# under a bare "You are a helpful assistant.", the 135M model's first word of this answer is a
# near tie between "The" and "La"/"L" (0.07-0.3 logits apart under 8-bit activations, llama.cpp's
# as ours) that any change in summation order tips; under these instructions it is 0.7-0.9 apart.
SYSTEM = {"role": "system", "content": DEFAULT_INSTRUCTIONS}
FRANCE = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
STORY = [{"role": "user", "content": "Write a long story about a dragon."}]


@pytest.fixture(scope="module")
def client(voice_server) -> OpenAI:
    return OpenAI(api_key="unused", base_url=voice_server.base_url + "/v1", max_retries=0)


@pytest.fixture(scope="module")
def model(engine) -> str:
    return engine.model_name


@pytest.fixture(scope="module")
def paris(client, model):
    """The whole (non-streamed) answer to the factual question."""
    return client.chat.completions.create(model=model, messages=FRANCE, max_tokens=40)


def metric(server, name: str) -> float:
    for line in httpx.get(server.base_url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"/metrics has no {name}")


def wait_for_metric(server, name: str, value: float, timeout_s: float = 30.0) -> float:
    deadline = time.monotonic() + timeout_s
    while (current := metric(server, name)) != value and time.monotonic() < deadline:
        time.sleep(0.05)
    return current


def test_models_names_the_engine_model(client, model):
    listed = client.models.list().data
    assert [(m.id, m.object, m.owned_by) for m in listed] == [(model, "model", "dllm-voice")]
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_whole_answer_with_usage_and_engine_stats(paris):
    choice = paris.choices[0]
    assert "paris" in choice.message.content.lower(), choice.message.content
    assert (choice.index, choice.finish_reason, choice.message.role) == (0, "stop", "assistant")
    stats = choice.x_dllm
    assert stats["forward_passes"] >= 1 and stats["tokens_per_forward"] > 0 and stats["deadline_met"] is None
    usage = paris.usage
    assert usage.prompt_tokens > 5 and usage.completion_tokens == stats["new_tokens"] > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_streamed_answer_is_the_whole_answer_in_chunks(client, model, paris):
    # the same question as text parts: exact decoding gives the same reply, token for token
    messages = [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "What is the capital "},
                                                     {"type": "text", "text": "of France?"}]}]
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=40, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == paris.choices[0].message.content
    finishes = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1 and finishes[0].choices[0].finish_reason == "stop"
    assert finishes[0].choices[0].x_dllm["new_tokens"] == chunks[-1].usage.completion_tokens
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == paris.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_the_event_stream_is_openai_sse_ending_with_done(voice_server, model):
    body = {"model": model, "messages": FRANCE, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", voice_server.base_url + "/v1/chat/completions", json=body, timeout=60) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [line for line in reply.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]" and events.count("data: [DONE]") == 1


def test_stop_sequences_end_the_text_before_them(client, model, paris):
    full = paris.choices[0].message.content
    whole = client.chat.completions.create(model=model, messages=FRANCE, max_tokens=40, stop="Paris")
    assert whole.choices[0].message.content == full[: full.index("Paris")]
    assert whole.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model=model, messages=FRANCE, max_tokens=40, stream=True,
                                              stop=["never said", " is Paris"])
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full[: full.index(" is Paris")]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_max_tokens_ends_with_length(client, model):
    reply = client.chat.completions.create(model=model, messages=STORY, max_completion_tokens=3)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 3


async def test_four_parallel_streams_each_answer_their_question(voice_server, model):
    questions = {"What is the capital of France?": "paris", "What is the capital of Japan?": "tokyo",
                 "What is the capital of Germany?": "berlin", "Who wrote Romeo and Juliet?": "shakespeare"}
    async with AsyncOpenAI(api_key="unused", base_url=voice_server.base_url + "/v1", max_retries=0) as client:
        async def ask(question: str) -> tuple[str, list[str]]:
            stream = await client.chat.completions.create(
                model=model, messages=[SYSTEM, {"role": "user", "content": question}], max_tokens=40, stream=True)
            chunks = [chunk async for chunk in stream]
            return ("".join(c.choices[0].delta.content or "" for c in chunks),
                    [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason])

        answers = await asyncio.gather(*(ask(question) for question in questions))
    for (text, finishes), keyword in zip(answers, questions.values()):
        assert keyword in text.lower(), text
        assert len(finishes) == 1 and finishes[0] in ("stop", "length")


def test_n_choices_and_seeded_sampling(client, model):
    reply = client.chat.completions.create(model=model, messages=STORY, max_tokens=12, n=2, temperature=0.8, seed=5)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.usage.completion_tokens == sum(c.x_dllm["new_tokens"] for c in reply.choices)
    again = client.chat.completions.create(model=model, messages=STORY, max_tokens=12, temperature=0.8, seed=5)
    assert again.choices[0].message.content == reply.choices[0].message.content


def test_deadline_field_reaches_the_engine(client, model):
    reply = client.chat.completions.create(model=model, messages=FRANCE, max_tokens=20, extra_body={"x_deadline_s": 30})
    stats = reply.choices[0].x_dllm
    assert stats["deadline_s"] == 30 and stats["deadline_met"] is True  # 20 tokens take well under 30 s


LONG_TEXT = "The quick brown fox jumps over the lazy dog. " * 1200  # about 12k tokens: over any context


@pytest.mark.parametrize("fields, status, param, words", [
    ({"messages": None}, 400, "messages", "required"),
    ({"messages": "What is the capital of France?"}, 400, "messages", "must be a list"),
    ({"messages": [{"role": "user"}]}, 400, "messages[0].content", "no `content`"),
    ({"messages": [{"role": "robot", "content": "Hi"}]}, 400, "messages[0].role", "robot"),
    ({"model": "gpt-4o"}, 404, "model", "gpt-4o"),
    ({"max_tokens": -3}, 400, "max_tokens", "at least 1"),
    ({"max_tokens": 1_000_000}, 400, "max_tokens", "too large"),
    ({"messages": [{"role": "user", "content": LONG_TEXT}]}, 400, "messages", "tokens long"),
    ({"messages": [{"role": "user", "content": LONG_TEXT[:6000]}], "max_tokens": 1000}, 400, "messages",
     "in the messages"),
    ({"n": 50}, 400, "n", "1..8"),
    ({"top_p": 0.5}, 400, "top_p", "not supported"),
    ({"extra_body": {"frobnicate": True}}, 400, "frobnicate", "Unrecognized"),
])
def test_bad_requests_get_openai_errors(client, model, fields, status, param, words):
    request = {"model": model, "messages": FRANCE, **fields}
    extra = request.pop("extra_body", None)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(**request, extra_body=extra)
    error = caught.value
    assert (error.status_code, error.param) == (status, param)
    assert words in error.message and error.type == "invalid_request_error"


@pytest.mark.parametrize("raw, words", [(b"", "empty"), (b'{"model": ', "not valid JSON")])
def test_unreadable_bodies_get_openai_errors(voice_server, raw, words):
    reply = httpx.post(voice_server.base_url + "/v1/chat/completions", content=raw,
                       headers={"content-type": "application/json"})
    assert reply.status_code == 400 and words in reply.json()["error"]["message"]


def test_a_prompt_over_the_context_says_how_long(client, model, engine, voice_server):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": LONG_TEXT}])
    count = engine.count_tokens([{"role": "user", "content": LONG_TEXT}])
    limit = min(voice_server.settings.context_tokens, engine.max_context_tokens)
    assert f"{count} tokens long" in caught.value.message and f"{limit} tokens" in caught.value.message
    assert caught.value.code == "context_length_exceeded"


def test_the_servers_exposure_rules_cover_the_text_api(make_server, model):
    server = make_server(api_token="tok-123")
    with pytest.raises(openai.AuthenticationError):
        OpenAI(api_key="wrong", base_url=server.base_url + "/v1", max_retries=0).models.list()
    assert httpx.get(server.base_url + "/v1/models").status_code == 401
    keyed = OpenAI(api_key="tok-123", base_url=server.base_url + "/v1", max_retries=0)
    assert keyed.chat.completions.create(model=model, messages=FRANCE, max_tokens=2).choices[0].finish_reason
    from_a_page = httpx.post(server.base_url + "/v1/chat/completions", json={"model": model, "messages": FRANCE},
                             headers={"Origin": "https://elsewhere.example", "Authorization": "Bearer tok-123"})
    assert from_a_page.status_code == 403


def test_an_engine_at_its_limits_answers_429_with_retry_after(client, model, engine, voice_server):
    # earlier tests' requests still ending would free room between the fill and the request
    assert wait_for_metric(voice_server, "voice_engine_live_requests", 0, timeout_s=120) == 0
    fillers, refused, accepted = [], None, 0
    try:
        # a request of another test's session that ends between the fill and the chat request
        # frees a slot on this shared server: the engine is filled again and asked again
        while refused is None and accepted < 3:
            fillers += fill_to_the_limit(engine, len(fillers))
            try:
                client.chat.completions.create(model=model, messages=FRANCE, max_tokens=5)
                accepted += 1
            except openai.RateLimitError as exc:
                refused = exc
    finally:
        for handle in fillers:
            handle.cancel()
    ended = [h.last.finish_reason for h in fillers if h.last is not None and h.last.final]
    assert refused is not None, f"never refused: {len(fillers)} fillers, ended early: {ended}"
    assert int(refused.response.headers["retry-after"]) >= 1
    assert refused.code == "engine_overloaded" and "limit" in refused.message
    assert wait_for_metric(voice_server, "voice_engine_live_requests", 0) == 0


def fill_to_the_limit(engine, seed0: int) -> list[RequestHandle]:
    """Requests that stay live until cancelled: sampled with their own seeds and long, so neither
    an earlier test's greedy story nor another filler hands them continuation drafts to finish on."""
    fillers = []
    try:
        while len(fillers) < 100:  # the engine's own limits end this loop
            params = GenerationParams(max_new_tokens=1024, stop_at_eos=False, temperature=1.0,
                                      seed=seed0 + len(fillers), background=True)
            fillers.append(engine.submit(STORY, params))
    except EngineOverloaded:
        pass
    return fillers


def test_an_abandoned_stream_cancels_its_engine_request(client, model, voice_server):
    abandoned = metric(voice_server, "voice_chat_completions_abandoned_total")
    stream = client.chat.completions.create(model=model, messages=STORY, max_tokens=1000, stream=True)
    for chunk in stream:
        if chunk.choices[0].delta.content:
            break
    assert metric(voice_server, "voice_engine_live_requests") >= 1  # the story is far from done
    assert metric(voice_server, "voice_engine_kv_cache_bytes") > 0  # its keys and values
    stream.close()
    assert wait_for_metric(voice_server, "voice_engine_live_requests", 0) == 0
    assert metric(voice_server, "voice_chat_completions_abandoned_total") == abandoned + 1


def test_a_client_that_stops_waiting_for_a_whole_reply_cancels_it(voice_server, model):
    abandoned = metric(voice_server, "voice_chat_completions_abandoned_total")
    body = {"model": model, "messages": STORY, "max_tokens": 1000}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(voice_server.base_url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(5, read=1.0))
    assert wait_for_metric(voice_server, "voice_engine_live_requests", 0) == 0
    assert wait_for_metric(voice_server, "voice_chat_completions_abandoned_total", abandoned + 1) == abandoned + 1


class StallingEngine:
    """An engine that streams three words and then has nothing to say until it is cancelled
    (a reply waiting on a long prefill, or held back by a stop sequence): a disconnect is then
    the only thing that can end it early."""

    model_name = "stalling"
    max_context_tokens = 4096

    def __init__(self) -> None:
        self.handles: list[RequestHandle] = []

    @property
    def live_requests(self) -> int:
        return sum(not handle.done for handle in self.handles)

    def count_tokens(self, messages) -> int:
        return 10

    def submit(self, messages, params) -> RequestHandle:
        handle = RequestHandle(len(self.handles) + 1)
        self.handles.append(handle)
        threading.Thread(target=self._run, args=(handle,), daemon=True).start()
        return handle

    @staticmethod
    def _run(handle: RequestHandle) -> None:
        words = []
        for step, word in enumerate(["Once", "upon", "a"], start=1):
            words.append(word)
            handle._publish(DraftUpdate(handle.request_id, " ".join(words) + " ", "", list(range(step)), step, False))
        handle._cancelled.wait()
        handle._publish(DraftUpdate(handle.request_id, " ".join(words) + " ", "", [0, 1, 2], 4, True, "cancelled"))


def read_stream_then_leave(base_url: str, body: dict, frames: int) -> None:
    """A real client on a raw socket: posts a streamed request, reads `frames` SSE frames, closes."""
    host, port = base_url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + host.encode() + b"\r\n"
                 b"Content-Type: application/json\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n"
                 + payload)
    received = b""
    while received.count(b"data: ") < frames:
        piece = sock.recv(65536)
        assert piece, f"the server closed the stream early: {received!r}"
        received += piece
    sock.close()


def test_a_client_that_leaves_a_stalled_stream_cancels_it_at_the_disconnect(make_server, voice_server):
    engine = StallingEngine()
    speech = voice_server.voice_server.models
    server = make_server(LoadedModels(engine, speech.transcriber, speech.synthesizer, speech.vad))
    body = {"model": "stalling", "messages": STORY, "max_tokens": 100, "stream": True}
    read_stream_then_leave(server.base_url, body, frames=4)  # the role chunk and three words
    assert engine.handles[0]._cancelled.wait(5), "the request outlived its client"


def test_a_client_that_goes_away_mid_stream_ends_its_request_within_a_step_or_two(voice_server, model, engine):
    body = {"model": model, "messages": STORY, "max_tokens": 1000, "stream": True}
    passes = []
    leaving = threading.Thread(target=lambda: (read_stream_then_leave(voice_server.base_url, body, 4),
                                               passes.append(engine.forward_passes)))
    leaving.start()
    leaving.join(60)
    assert passes, "the client never got its chunks"
    deadline = time.monotonic() + 10
    while engine.live_requests and time.monotonic() < deadline:
        time.sleep(0.005)
    assert engine.live_requests == 0
    assert engine.forward_passes - passes[0] <= 3, "the request went on stepping after the client left"
