"""The server events that open and close a response on the wire, in the protocol's order.

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
    events = [p.server_event("response.created", response=response.response_shape("in_progress")),
              p.server_event("response.output_item.added", **ids, item=response.item_event_shape())]
    if not response.out_of_band:
        events.append(p.server_event("conversation.item.added", previous_item_id=previous_item_id,
                                     item=response.item_event_shape()))
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
    item_shape = response.item_event_shape()
    events += [p.server_event("response.content_part.done", **ids, part=part),
               p.server_event("response.output_item.done", response_id=response.id, output_index=0, item=item_shape)]
    if not response.out_of_band:
        events.append(p.server_event("conversation.item.done", item=item_shape))
    events.append(p.server_event("response.done", response=response.response_shape(status, reason)))
    return events
