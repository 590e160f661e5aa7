"""One conversation, whatever carries it: session.py (client events, responses, speculation,
barge-in), turns.py (the user's turns: VAD, partial and final transcripts), response.py (one
reply: engine -> sentences -> TTS -> sink), audio_sink.py (where reply audio goes and what was
heard), conversation.py, options.py, models.py (the model slots, as Protocols)."""
