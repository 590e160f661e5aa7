"""Audio plumbing: PCM16 conversion, resampling, the input buffer."""
