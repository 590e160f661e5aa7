"""The OpenAI Realtime API on a websocket: server.py (Starlette on uvicorn), protocol.py (the
events, validated), beta_dialect.py (pre-GA clients), event_feed.py (a client's view of events)."""
