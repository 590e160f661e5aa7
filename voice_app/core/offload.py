"""Engine submits off the event loop: rendering the chat template and tokenizing a prompt take
milliseconds (seconds for a huge one), which every session on the loop would wait out."""

from __future__ import annotations

import asyncio
from typing import Any, Callable


async def submit_off_loop(submit: Callable[[], Any]) -> Any:
    """`submit()` (-> a RequestHandle) on a worker thread. A caller cancelled meanwhile leaves no
    request behind: the handle is cancelled as soon as the engine returns it."""
    submitted = asyncio.get_running_loop().run_in_executor(None, submit)
    try:
        return await asyncio.shield(submitted)
    except asyncio.CancelledError:
        submitted.add_done_callback(_cancel_unread)
        raise


def _cancel_unread(submitted: asyncio.Future) -> None:
    if not submitted.cancelled() and submitted.exception() is None:
        submitted.result().cancel()
