"""Audio plumbing: PCM16 conversion, resampling, voice activity detection."""
