"""The voice pipeline: realtime sessions over ASR, the diffusion LLM engine and TTS."""
