"""x_engine in session.update: a session chooses how its own replies are decoded (mode,
threshold) where the operator allows it and the model can; refusals name the reason."""

from __future__ import annotations

import json

from voice_app.core.session import Session
from voice_app.settings import Settings

from ..clients import EventLog
from ..fakes import ScriptedEngine, ScriptedModels
from .test_session import is_done, text_turn


def update(engine: dict) -> str:
    return json.dumps({"type": "session.update", "session": {"type": "realtime", "x_engine": engine}})


def make(models: ScriptedModels | None = None, **settings) -> tuple[Session, EventLog, ScriptedModels]:
    models = models or ScriptedModels()
    log = EventLog()
    return Session(models, Settings(turn_detection="server_vad", **settings), log.send), log, models


async def ask(session: Session, log: EventLog) -> None:
    await session.handle_text(text_turn("What is two plus two?"))
    await session.handle_text('{"type": "response.create"}')
    await log.wait_for(is_done())


async def test_a_session_chooses_its_replies_mode_and_threshold_and_sees_them_in_session_updated():
    session, log, models = make(engine_mode="auto")
    await session.start()
    assert log.of_type("session.created")[0]["session"]["x_engine"] == {"mode": "auto", "threshold": None,
                                                                              "takes_threshold": True}
    await session.handle_text(update({"mode": "diffusion", "threshold": 0.9}))
    assert log.of_type("session.updated")[-1]["session"]["x_engine"]["threshold"] == 0.9
    await ask(session, log)
    assert (models.engine.params[-1].mode, models.engine.params[-1].threshold) == ("diffusion", 0.9)

    await session.handle_text(update({"threshold": None}))  # back to exact, the mode kept
    shown = log.of_type("session.updated")[-1]["session"]["x_engine"]
    assert (shown["mode"], shown["threshold"]) == ("diffusion", None)
    assert log.of_type("error") == []
    await session.close()


async def test_a_bad_value_or_a_server_that_forbids_it_is_refused_with_the_reason():
    session, log, _ = make()
    await session.start()
    await session.handle_text(update({"mode": "fastest", "threshold": 2}))
    message = log.of_type("error")[-1]["error"]["message"]
    assert "x_engine.mode" in message and "x_engine.threshold" in message
    await session.close()

    session, log, models = make(client_engine_settings=False)
    await session.start()
    await session.handle_text(update({"mode": "autoregressive"}))
    assert "--client-engine-settings" in log.of_type("error")[-1]["error"]["message"]
    await ask(session, log)
    assert models.engine.params[-1].mode == "auto"  # the server's own
    await session.close()


async def test_a_threshold_is_refused_where_the_model_decodes_exactly_anyway():
    engine = ScriptedEngine()
    engine.takes_threshold = False  # a draft head verified by its target
    session, log, _ = make(ScriptedModels(engine=engine))
    await session.start()
    await session.handle_text(update({"mode": "diffusion", "threshold": 0.5}))
    error = log.of_type("error")[-1]["error"]
    assert error["param"] == "x_engine.threshold" and "exact" in error["message"]
    assert log.of_type("session.updated")[-1]["session"]["x_engine"] == {"mode": "diffusion", "threshold": None,
                                                                          "takes_threshold": False}
    await session.close()


async def test_clients_without_our_extensions_do_not_see_x_engine():
    models = ScriptedModels()
    log = EventLog()
    session = Session(models, Settings(), log.send, x_events=False)
    await session.start()
    assert "x_engine" not in log.of_type("session.created")[0]["session"]
    await session.close()
