"""The echo guard: a speaker that the mic hears would make the assistant interrupt itself.

While the speaker plays (and for the echo tail after it), `EchoGate` passes a mic frame to the VAD
only when it is clearly louder than the echo that the frame's playback reference would produce;
the echo path's gain is measured continuously during playback (90th percentile of mic/reference
level ratios of echo-only frames), so it adapts to the room and the volume. Talking over the
assistant is louder than its echo and passes, held open between syllables; the echo alone is
replaced by silence. `--echo-guard off` for headsets.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np


def rms(samples: np.ndarray) -> float:
    if len(samples) == 0:
        return 0.0
    audio = samples.astype(np.float32)
    return float(np.sqrt(np.mean(audio * audio)))


class EchoGate:
    """Suppresses mic frames that are only the echo of what the speaker plays.

    `played` records the level of each output block and the time it reaches the speaker;
    `filter` compares a mic frame with the loudest reference block that could echo into it
    (played within `max_delay_s` before the frame was captured). The echo gain is the 90th
    percentile of the mic/reference ratio over recent echo-only frames (the loudest the echo
    usually gets); a frame passes when it is `margin` times louder than that predicts.

    A person talking over the reply: once `onset_frames` frames in a row pass, the gate stays
    open for `hold_s` after each loud frame, so the soft sounds between their syllables reach
    the VAD and Whisper too (without the hold, "Wait, stop, tell me about dogs" reached them
    as scraps). Frames judged to be the person never train the echo gain: they used to raise
    it within half a second of talking until the gate shut on the person.
    Thread-safe: the output callback writes, the loop reads.
    """

    AUDIBLE = 30.0  # reference RMS (int16) below this (-60 dBFS) is silence: nothing can echo

    def __init__(self, margin: float = 2.0, max_delay_s: float = 0.5, initial_gain: float = 1.0,
                 history: int = 150, hold_s: float = 0.3, onset_frames: int = 2, calibration_frames: int = 25):
        self.margin = margin
        self.max_delay_s = max_delay_s  # speaker -> mic, device buffers included (PulseAudio: ~0.3 s)
        self.hold_s = hold_s
        self.onset_frames = onset_frames
        # Until this many ratios are measured every frame trains the gain: an initial guess that
        # is too low would otherwise pass the echo as "the person" and never learn the truth.
        self.calibration_frames = calibration_frames
        self._gain = initial_gain  # mic level / speaker level of the echo path, until measured
        self._ratios: deque[float] = deque(maxlen=history)  # ~3 s of 20 ms echo frames
        self._reference: deque[tuple[float, float]] = deque()  # (time at the speaker, level)
        self._audible_since: float | None = None
        self._loud_run = 0  # consecutive frames louder than the echo
        self._person_until = float("-inf")  # the hold: frames captured before this pass
        self._lock = threading.Lock()

    def played(self, samples: np.ndarray, at: float) -> None:
        with self._lock:
            self._reference.append((at, rms(samples)))
            while self._reference and self._reference[0][0] < at - 5.0:
                self._reference.popleft()

    def reference_level(self, captured_at: float) -> float:
        with self._lock:
            return max((level for at, level in self._reference
                        if captured_at - self.max_delay_s <= at <= captured_at + 0.05), default=0.0)

    def filter(self, samples: np.ndarray, captured_at: float) -> np.ndarray:
        reference = self.reference_level(captured_at)
        if reference < self.AUDIBLE:  # nothing playing: the mic is all user
            self._audible_since = None
            return samples
        if self._audible_since is None:
            self._audible_since = captured_at
        level = rms(samples)
        # Right after playback starts the echo is still on its way: a quiet mic then says
        # nothing about the echo path, so only later frames measure it.
        echo_arrived = captured_at - self._audible_since >= self.max_delay_s
        if level > self.margin * self._gain * reference:
            self._loud_run += 1
            if self._loud_run >= self.onset_frames:
                self._person_until = captured_at + self.hold_s
            if echo_arrived and len(self._ratios) < self.calibration_frames:
                self._learn(level / reference)
            return samples
        self._loud_run = 0
        if captured_at < self._person_until:  # the person is mid-word
            return samples
        if echo_arrived:
            self._learn(level / reference)
        return np.zeros_like(samples)

    def _learn(self, ratio: float) -> None:
        self._ratios.append(ratio)
        self._gain = float(np.percentile(self._ratios, 90))
