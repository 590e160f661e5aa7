"""What each client event does to a session: one handler per event type.

The handlers act through the session's public parts (its conversation, options, listener,
speculation and replies, `send` and `send_error`), so session.py keeps the conversation's own
flow (the user's turns and barge-in) and core/replies.py the replies' lifecycle.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from voice_app.audio.pcm import AudioFormatError, decode_base64_pcm16
from voice_app.core.conversation import ConversationItem, announce_evictions, new_id
from voice_app.core.user_turn import TurnClock
from voice_app.events import protocol as p
from voice_app.events.session_config import applied_settings, session_config

if TYPE_CHECKING:
    from voice_app.core.session import Session

LARGE_AUDIO_CHARS = 1 << 16  # base64 decoded on a worker thread (~10 ms a MiB)


class ClientEvents:
    def __init__(self, session: Session):
        self.session = session
        self.replies = session.replies
        self._handlers: dict[str, Callable[[Any], Awaitable[None]]] = {
            "session.update": self._on_session_update,
            "input_audio_buffer.append": self._on_input_audio_buffer_append,
            "input_audio_buffer.commit": self._on_input_audio_buffer_commit,
            "input_audio_buffer.clear": self._on_input_audio_buffer_clear,
            "conversation.item.create": self._on_conversation_item_create,
            "conversation.item.truncate": self._on_conversation_item_truncate,
            "response.create": self._on_response_create,
            "response.cancel": self._on_response_cancel,
            "output_audio_buffer.clear": self._on_output_audio_buffer_clear,
            "conversation.item.retrieve": self._on_conversation_item_retrieve,
            "conversation.item.delete": self._on_conversation_item_delete,
        }

    async def handle(self, event: Any) -> None:
        await self._handlers[event.type](event)

    async def _on_session_update(self, event: p.SessionUpdate) -> None:
        """Applies every setting it can; the refused ones are named in an `error` (with what was
        applied), and session.updated shows the session as it now is."""
        config, refused = session_config(event.session)
        refused += self.session.options.update(config)
        if config.x_events is not None:
            self.session.x_events = config.x_events
        if refused:
            names = {r.param for r in refused}
            applied = [name for name in applied_settings(config) if name not in names]
            await self.session.send_error(p.ProtocolError(
                "invalid_value" if any(not r.unsupported for r in refused) else "unsupported_value",
                "session.update: not applied: " + "; ".join(f"{r.param} ({r.message})" for r in refused)
                + (f"; applied: {', '.join(applied)}" if applied else "; nothing else was changed")
                + "; the session goes on with its other settings",
                ", ".join(r.param for r in refused), event.event_id))
        await self.session.send(p.server_event("session.updated", session=self.session.session_shape()))

    async def _on_input_audio_buffer_append(self, event: p.InputAudioBufferAppend) -> None:
        try:
            if len(event.audio) > LARGE_AUDIO_CHARS:
                samples = await asyncio.to_thread(decode_base64_pcm16, event.audio)
            else:
                samples = decode_base64_pcm16(event.audio)
        except AudioFormatError as exc:
            raise p.ProtocolError("invalid_audio", str(exc), "audio", event.event_id) from exc
        await self.session.push_pcm16(samples)

    async def _on_input_audio_buffer_commit(self, event: p.InputAudioBufferCommit) -> None:
        await self.session.listener.commit(event.event_id)

    async def _on_input_audio_buffer_clear(self, event: p.InputAudioBufferClear) -> None:
        self.session.listener.clear()
        self.session.speculation.drop()
        paused = self.replies.paused
        if paused is not None:  # the words that paused it are gone
            self.replies.resume(paused)
        await self.session.send(p.server_event("input_audio_buffer.cleared"))

    async def _on_conversation_item_create(self, event: p.ConversationItemCreate) -> None:
        item = ConversationItem(event.item.id or new_id("item"), event.item.role, event.item.text)
        if self.session.conversation.find(item.id) is not None:
            raise p.ProtocolError("invalid_value", f"item id {item.id!r} is already in the conversation",
                                  "item.id", event.event_id)
        previous = self.session.conversation.add(item)
        self.session.speculation.drop()  # the context changed under it
        shape = p.message_item(item.id, item.role, item.text)
        await self.session.send(p.server_event("conversation.item.added", previous_item_id=previous, item=shape))
        await self.session.send(p.server_event("conversation.item.done", previous_item_id=previous, item=shape))
        await announce_evictions(self.session.conversation, self.session.send)

    async def _on_response_create(self, event: p.ResponseCreate) -> None:
        """`input`: the prompt's items instead of the conversation's; `conversation: "none"`: an
        out-of-band reply that the conversation does not keep; `metadata` is echoed."""
        options, session = event.response or p.ResponseOptions(), self.session
        instructions = options.instructions if options.instructions is not None else session.options.instructions
        audio_out = (session.options.audio_out if options.output_modalities is None
                     else "audio" in options.output_modalities)
        reply_tokens = (session.options.max_output_tokens if options.max_output_tokens is None
                        else session.options.reply_tokens(options.max_output_tokens, event.event_id))
        async with self.replies.start_lock:
            if self.replies.active is not None:
                raise p.ProtocolError("conversation_already_has_active_response",
                                      f"response {self.replies.active.id} is still in progress; cancel it first",
                                      None, event.event_id)
            system = self.session.system_prompt(instructions)
            if options.input is not None:
                messages = self._input_messages(options.input, system, event.event_id)
            else:
                messages = self.session.conversation.messages(system)
            if options.conversation != "none":
                self.session.speculation.drop()
            response = await self.replies.start(messages, audio_out, reply_tokens, event.event_id)
            response.metadata = options.metadata
            response.out_of_band = options.conversation == "none"
            await self.replies.activate(response, TurnClock())

    def _input_messages(self, items: list[Any], system: str, event_id: str | None) -> list[dict[str, str]]:
        """A response's own `input` as the engine's messages; references name conversation items."""
        messages = [{"role": "system", "content": system}] if system else []
        for index, entry in enumerate(items):
            if isinstance(entry, p.ItemReference):
                item = self.session.conversation.find(entry.id)
                if item is None:
                    raise p.ProtocolError("item_not_found", f"response.input[{index}] names item {entry.id!r}, "
                                          "which is not in the conversation", f"response.input.{index}.id", event_id)
                role, text = item.role, self.replies.item_text(item)
            else:
                role, text = entry.role, entry.text
            if text.strip():
                messages.append({"role": role, "content": text})
        return messages

    async def _on_response_cancel(self, event: p.ResponseCancel) -> None:
        active = self.replies.active
        if active is None or (event.response_id and event.response_id != active.id):
            raise p.ProtocolError("response_cancel_not_active",
                                  f"no active response{' ' + event.response_id if event.response_id else ''} to cancel",
                                  "response_id", event.event_id)
        await self.replies.interrupt(active, reason="client_cancelled", send_cleared=False)

    async def _on_conversation_item_truncate(self, event: p.ConversationItemTruncate) -> None:
        item = self.session.conversation.find(event.item_id)
        if item is None or item.role != "assistant":
            raise p.ProtocolError("invalid_value", f"no assistant item {event.item_id!r} to truncate",
                                  "item_id", event.event_id)
        if event.audio_end_ms > item.audio_ms + 1:
            raise p.ProtocolError("invalid_value",
                                  f"audio_end_ms {event.audio_end_ms} is past the item's audio ({item.audio_ms:.0f} ms)",
                                  "audio_end_ms", event.event_id)
        active = self.replies.active
        if active is not None and active.item is item:
            await self.replies.interrupt(active, reason="client_truncated", send_cleared=False)
        self.replies.forget_playback_of(item)  # the client stopped playing it
        item.truncate_to_heard(event.audio_end_ms)
        await self.session.send(p.server_event("conversation.item.truncated", item_id=item.id,
                                               content_index=event.content_index, audio_end_ms=event.audio_end_ms))

    def _find_item(self, item_id: str, event_id: str | None) -> ConversationItem:
        item = self.session.conversation.find(item_id)
        if item is None:
            raise p.ProtocolError("item_not_found", f"no item {item_id!r} in the conversation (it was never added, "
                                  "was deleted, or was forgotten by the history cap)", "item_id", event_id)
        return item

    async def _on_conversation_item_retrieve(self, event: p.ConversationItemRetrieve) -> None:
        item = self._find_item(event.item_id, event.event_id)
        await self.session.send(p.server_event("conversation.item.retrieved", item=p.message_item(
            item.id, item.role, self.replies.item_text(item), item.status, item.audio)))

    async def _on_conversation_item_delete(self, event: p.ConversationItemDelete) -> None:
        item = self._find_item(event.item_id, event.event_id)
        active = self.replies.active
        if active is not None and active.item is item:
            raise p.ProtocolError("invalid_value", f"item {item.id!r} is the reply of response {active.id}, "
                                  "still in progress; cancel it first", "item_id", event.event_id)
        self.session.conversation.remove(item.id)
        self.replies.forget_playback_of(item)
        self.session.speculation.drop()  # the context changed under it
        await self.session.send(p.server_event("conversation.item.deleted", item_id=item.id))

    async def _on_output_audio_buffer_clear(self, event: p.OutputAudioBufferClear) -> None:
        active = self.replies.active
        if active is not None:
            await self.replies.interrupt(active, reason="client_cleared", send_cleared=True)
        else:
            await self.session.send(p.server_event("output_audio_buffer.cleared", response_id=None))
