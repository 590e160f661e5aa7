"""The session's language: the client events it takes (validated), the server events it sends,
and session.update's settings. Core speaks it; each transport (realtime/ over a websocket,
desktop/ in-process) carries it. It imports nothing else of voice_app."""
