"""What each client event does to a session: the handlers of Session's dispatch table.

A part of Session (it is one of Session's bases, so `self` is the session): the handlers use
its conversation, options, listener, speculation and responses, and its `_send`, `send_error`,
`_interrupt`, `_start_response` and `_activate`. Kept apart so that session.py holds the
conversation's own flow: the user's turns, responses and barge-in.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from voice_app.audio.pcm import AudioFormatError, decode_base64_pcm16
from voice_app.core.conversation import ConversationItem, announce_evictions, new_id
from voice_app.core.turns import TurnClock
from voice_app.events import protocol as p
from voice_app.events.session_config import applied_settings, session_config

if TYPE_CHECKING:
    from voice_app.core.session import Session

LARGE_AUDIO_CHARS = 1 << 16  # base64 decoded on a worker thread (~10 ms a MiB)


class ClientEvents:
    async def _on_session_update(self: Session, event: p.SessionUpdate) -> None:
        """Applies every setting it can; the refused ones are named in an `error` (with what was
        applied), and session.updated shows the session as it now is."""
        config, refused = session_config(event.session)
        refused += self.options.update(config)
        if config.x_events is not None:
            self.x_events = config.x_events
        if refused:
            names = {r.param for r in refused}
            applied = [name for name in applied_settings(config) if name not in names]
            await self.send_error(p.ProtocolError(
                "invalid_value" if any(not r.unsupported for r in refused) else "unsupported_value",
                "session.update: not applied: " + "; ".join(f"{r.param} ({r.message})" for r in refused)
                + (f"; applied: {', '.join(applied)}" if applied else "; nothing else was changed")
                + "; the session goes on with its other settings",
                ", ".join(r.param for r in refused), event.event_id))
        await self._send(p.server_event("session.updated", session=self.session_shape()))

    async def _on_input_audio_buffer_append(self: Session, event: p.InputAudioBufferAppend) -> None:
        try:
            if len(event.audio) > LARGE_AUDIO_CHARS:
                samples = await asyncio.to_thread(decode_base64_pcm16, event.audio)
            else:
                samples = decode_base64_pcm16(event.audio)
        except AudioFormatError as exc:
            raise p.ProtocolError("invalid_audio", str(exc), "audio", event.event_id) from exc
        await self.push_pcm16(samples)

    async def _on_input_audio_buffer_commit(self: Session, event: p.InputAudioBufferCommit) -> None:
        await self.listener.commit(event.event_id)

    async def _on_input_audio_buffer_clear(self: Session, event: p.InputAudioBufferClear) -> None:
        self.listener.clear()
        self._speculation.drop()
        if self._active is not None and self._active.paused:  # the words that paused it are gone
            self._spawn(self._active.resume(), "resume")
        await self._send(p.server_event("input_audio_buffer.cleared"))

    async def _on_conversation_item_create(self: Session, event: p.ConversationItemCreate) -> None:
        item = ConversationItem(event.item.id or new_id("item"), event.item.role, event.item.text)
        if self.conversation.find(item.id) is not None:
            raise p.ProtocolError("invalid_value", f"item id {item.id!r} is already in the conversation",
                                  "item.id", event.event_id)
        previous = self.conversation.add(item)
        self._speculation.drop()  # the context changed under it
        shape = p.message_item(item.id, item.role, item.text)
        await self._send(p.server_event("conversation.item.added", previous_item_id=previous, item=shape))
        await self._send(p.server_event("conversation.item.done", previous_item_id=previous, item=shape))
        await announce_evictions(self.conversation, self._send)

    async def _on_response_create(self: Session, event: p.ResponseCreate) -> None:
        """`input`: the prompt's items instead of the conversation's; `conversation: "none"`: an
        out-of-band reply that the conversation does not keep; `metadata` is echoed."""
        options = event.response or p.ResponseOptions()
        instructions = options.instructions if options.instructions is not None else self.options.instructions
        audio_out = self.options.audio_out if options.output_modalities is None else "audio" in options.output_modalities
        reply_tokens = (self.options.max_output_tokens if options.max_output_tokens is None
                        else self.options.reply_tokens(options.max_output_tokens, event.event_id))
        async with self._start_lock:
            if self._active is not None:
                raise p.ProtocolError("conversation_already_has_active_response",
                                      f"response {self._active.id} is still in progress; cancel it first",
                                      None, event.event_id)
            system = self._system_prompt(instructions)
            if options.input is not None:
                messages = self._input_messages(options.input, system, event.event_id)
            else:
                messages = self.conversation.messages(system)
            if options.conversation != "none":
                self._speculation.drop()
            response = await self._start_response(messages, audio_out, reply_tokens, event.event_id)
            response.metadata = options.metadata
            response.out_of_band = options.conversation == "none"
            await self._activate(response, TurnClock())

    def _input_messages(self: Session, items: list[Any], system: str, event_id: str | None) -> list[dict[str, str]]:
        """A response's own `input` as the engine's messages; references name conversation items."""
        messages = [{"role": "system", "content": system}] if system else []
        for index, entry in enumerate(items):
            if isinstance(entry, p.ItemReference):
                item = self.conversation.find(entry.id)
                if item is None:
                    raise p.ProtocolError("item_not_found", f"response.input[{index}] names item {entry.id!r}, "
                                          "which is not in the conversation", f"response.input.{index}.id", event_id)
                role, text = item.role, self._item_text(item)
            else:
                role, text = entry.role, entry.text
            if text.strip():
                messages.append({"role": role, "content": text})
        return messages

    async def _on_response_cancel(self: Session, event: p.ResponseCancel) -> None:
        active = self._active
        if active is None or (event.response_id and event.response_id != active.id):
            raise p.ProtocolError("response_cancel_not_active",
                                  f"no active response{' ' + event.response_id if event.response_id else ''} to cancel",
                                  "response_id", event.event_id)
        await self._interrupt(active, reason="client_cancelled", send_cleared=False)

    async def _on_conversation_item_truncate(self: Session, event: p.ConversationItemTruncate) -> None:
        item = self.conversation.find(event.item_id)
        if item is None or item.role != "assistant":
            raise p.ProtocolError("invalid_value", f"no assistant item {event.item_id!r} to truncate",
                                  "item_id", event.event_id)
        if event.audio_end_ms > item.audio_ms + 1:
            raise p.ProtocolError("invalid_value",
                                  f"audio_end_ms {event.audio_end_ms} is past the item's audio ({item.audio_ms:.0f} ms)",
                                  "audio_end_ms", event.event_id)
        if self._active is not None and self._active.item is item:
            await self._interrupt(self._active, reason="client_truncated", send_cleared=False)
        if self._playing is not None and self._playing.item is item:
            self._playing = None  # the client stopped playing it: no barge-in estimate overrides its word
        item.truncate_to_heard(event.audio_end_ms)
        await self._send(p.server_event("conversation.item.truncated", item_id=item.id,
                                        content_index=event.content_index, audio_end_ms=event.audio_end_ms))

    def _find_item(self: Session, item_id: str, event_id: str | None) -> ConversationItem:
        item = self.conversation.find(item_id)
        if item is None:
            raise p.ProtocolError("item_not_found", f"no item {item_id!r} in the conversation (it was never added, "
                                  "was deleted, or was forgotten by the history cap)", "item_id", event_id)
        return item

    def _item_text(self: Session, item: ConversationItem) -> str:
        """The item's text as the server holds it now (a reply being made: what was sent so far)."""
        active = self._active
        if active is not None and active.item is item and item.status == "in_progress":
            return active.spoken_text
        return item.text

    async def _on_conversation_item_retrieve(self: Session, event: p.ConversationItemRetrieve) -> None:
        item = self._find_item(event.item_id, event.event_id)
        await self._send(p.server_event("conversation.item.retrieved", item=p.message_item(
            item.id, item.role, self._item_text(item), item.status, item.audio)))

    async def _on_conversation_item_delete(self: Session, event: p.ConversationItemDelete) -> None:
        item = self._find_item(event.item_id, event.event_id)
        if self._active is not None and self._active.item is item:
            raise p.ProtocolError("invalid_value", f"item {item.id!r} is the reply of response {self._active.id}, "
                                  "still in progress; cancel it first", "item_id", event.event_id)
        self.conversation.remove(item.id)
        if self._playing is not None and self._playing.item is item:
            self._playing = None
        self._speculation.drop()  # the context changed under it
        await self._send(p.server_event("conversation.item.deleted", item_id=item.id))

    async def _on_output_audio_buffer_clear(self: Session, event: p.OutputAudioBufferClear) -> None:
        if self._active is not None:
            await self._interrupt(self._active, reason="client_cleared", send_cleared=True)
        else:
            await self._send(p.server_event("output_audio_buffer.cleared", response_id=None))
