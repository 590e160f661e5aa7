"""What reports a response: the server events that open and close it on the wire (in the
protocol's order), its shapes and usage, and its turn's x_turn.metrics.

Pure functions of the response: the session sends what they return. A reply in the
conversation also announces its item as a conversation item; an out-of-band one
(`conversation: "none"`) does not.
"""

from __future__ import annotations

from typing import Any

from voice_app.core.response import Response
from voice_app.events import protocol as p


def response_started(response: Response, previous_item_id: str | None) -> list[dict[str, Any]]:
    ids = {"response_id": response.id, "output_index": 0}
    events = [p.server_event("response.created", response=response_shape(response, "in_progress")),
              p.server_event("response.output_item.added", **ids, item=item_shape(response))]
    if not response.out_of_band:
        events.append(p.server_event("conversation.item.added", previous_item_id=previous_item_id,
                                     item=item_shape(response)))
    part = {"type": "audio", "transcript": ""} if response.audio_out else {"type": "text", "text": ""}
    events.append(p.server_event("response.content_part.added", **ids, item_id=response.item.id,
                                 content_index=0, part=part))
    return events


def response_ended(response: Response, status: str, reason: str | None = None) -> list[dict[str, Any]]:
    ids = {"response_id": response.id, "item_id": response.item.id, "output_index": 0, "content_index": 0}
    text = response.item.text
    if response.audio_out:
        events = [p.server_event("response.output_audio.done", **ids),
                  p.server_event("response.output_audio_transcript.done", **ids, transcript=text)]
        part = {"type": "audio", "transcript": text}
    else:
        events = [p.server_event("response.output_text.done", **ids, text=text)]
        part = {"type": "text", "text": text}
    shape = item_shape(response)
    events += [p.server_event("response.content_part.done", **ids, part=part),
               p.server_event("response.output_item.done", response_id=response.id, output_index=0, item=shape)]
    if not response.out_of_band:
        events.append(p.server_event("conversation.item.done", item=shape))
    events.append(p.server_event("response.done", response=response_shape(response, status, reason)))
    return events


def item_shape(response: Response) -> dict[str, Any]:
    item = response.item
    return p.message_item(item.id, "assistant", item.text, item.status, response.audio_out)


def response_shape(response: Response, status: str, reason: str | None = None) -> dict[str, Any]:
    shape: dict[str, Any] = {
        "id": response.id, "object": "realtime.response", "status": status,
        "output_modalities": ["audio"] if response.audio_out else ["text"],
        "output": [] if status == "in_progress" else [item_shape(response)],
        "metadata": response.metadata,
    }
    if reason:
        shape["status_details"] = {"type": status, "reason": reason}
    elif status == "failed":
        shape["status_details"] = {"type": "failed", "error": {
            "type": "server_error", "code": "engine_error", "message": response.failure or "the reply failed"}}
    if status != "in_progress":
        shape["usage"] = usage(response)
    return shape


def usage(response: Response) -> dict[str, Any]:
    """Token counts of response.done (all text: the voice is synthesised from the text)."""
    stats = getattr(response.last_update, "stats", None)
    prompt, new = (stats.prompt_tokens, stats.new_tokens) if stats is not None else (0, 0)
    cached = stats.cached_prompt_tokens if stats is not None else 0  # copied from an earlier request's cache
    return {"total_tokens": prompt + new, "input_tokens": prompt, "output_tokens": new,
            "input_token_details": {"text_tokens": prompt, "audio_tokens": 0, "cached_tokens": cached},
            "output_token_details": {"text_tokens": new, "audio_tokens": 0}}


def turn_report(response: Response) -> dict[str, Any]:
    """The x_turn.metrics fields: latencies of this turn in ms (None where not applicable)."""
    clock, stats = response.clock, getattr(response.last_update, "stats", None)
    return {
        "response_id": response.id,
        "speech_stopped_to_transcript_ms": clock.ms(clock.speech_stopped_at, clock.transcript_at),
        "speech_stopped_to_first_draft_ms": clock.ms(clock.speech_stopped_at, clock.first_draft_at),
        "speech_stopped_to_first_audio_ms": clock.ms(clock.speech_stopped_at, clock.first_audio_at),
        "speech_stopped_to_done_ms": clock.ms(clock.speech_stopped_at, clock.done_at),
        "barge_in_to_cleared_ms": clock.ms(clock.speech_started_at, clock.cleared_at),
        "tokens_per_forward": round(stats.tokens_per_forward, 3) if stats else None,
        "forward_passes": stats.forward_passes if stats else None,
        "prompt_tokens": stats.prompt_tokens if stats else None,
        # of them, keys and values already in the engine's pool (a head shared with a draft or
        # an earlier turn): the rest were prefilled after the end of speech or during it
        "cached_prompt_tokens": stats.cached_prompt_tokens if stats else None,
    }
