"""`voice-app desktop`: the assistant on this machine's microphone and speaker.

The same `Session` core as the server runs here; sounddevice streams are its transport instead
of a websocket (transport.py). Mic frames go to `Session.push_pcm16` at the device's rate (the
session resamples), through the echo guard (echo_gate.py) while the speaker plays. Each
response's audio goes to a `DeviceAudioSink` (playback.py), queued for the output stream, which
counts the samples it really played: a barge-in clears the queue and truncates the reply to what
came out of the speaker. Server events (transcripts, turn metrics) drive the console
(console.py); devices.py finds and checks the sound card; command.py is the CLI.
"""
