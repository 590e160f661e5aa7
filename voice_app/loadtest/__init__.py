"""`voice-app loadtest`: many concurrent realtime sessions speaking scripted audio; latency
percentiles per load level. script.py reads the conversation script, connection.py is one
websocket, user.py one simulated user (its microphone and its turns), report.py the word error
rate, the percentiles, the table and the plot; command.py is the CLI.

Each simulated user is a plain protocol client: a microphone task streams PCM16 at real-time
pace (20-40 ms frames, silence between utterances, like a real mic), and a script runner says
each turn's utterance and watches the server's events. All latencies are measured on the client
from *end of speech sent*: when the frame holding the utterance's last voiced 10 ms left (the
clip's trailing quiet, 200-450 ms in synthesised clips, is not counted as speech):

- eos_to_transcript_ms: -> `conversation.item.input_audio_transcription.completed`
  (includes the server's end-of-turn silence wait, as a user would feel it)
- eos_to_first_audio_ms: -> the reply's first `response.output_audio.delta`
- eos_to_done_ms: -> the reply's `response.done`
- barge_in_to_cleared_ms: the voice's start sent (the utterance's first frame, plus the near silence
  that leads a synthesised clip) -> `output_audio_buffer.cleared` for the reply
  talked over; stale_audio_deltas counts that reply's audio deltas that came while it was cleared
  (after `output_audio_buffer.cleared`, before a resume's `output_audio_buffer.started`).
"""
