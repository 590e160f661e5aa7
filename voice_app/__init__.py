"""The voice pipeline: realtime sessions over ASR, the diffusion LLM engine and TTS.

Rooms (dependencies point down the list; none point up):
    realtime/  the websocket server, the wire protocol, the beta dialect, a client's event feed
    desktop/   the same session on this machine's microphone and speaker
    loadtest/  simulated users against a running server
    core/      session (responses, barge-in), turns (VAD, transcripts), responses, conversation
    speech/    Whisper, Piper, Silero, their worker threads, the loaded models, packaged weights
    audio/     PCM16 conversion, resampling, the input buffer
core/ knows the models only through the Protocols in core/models.py and speaks the events of
events/protocol.py; docs/architecture.md has the map.
"""
