"""The speech models: asr.py (faster-whisper), tts.py (Piper), vad.py (Silero), workers.py (the
priority pools they share), loaded_models.py (everything a server loads once), weights.py (the
pinned weight packages and their checksums)."""
