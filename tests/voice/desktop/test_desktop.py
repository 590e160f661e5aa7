"""`voice-app desktop` on a real (virtual) sound card: a private PulseAudio daemon whose pipe
source is the microphone (fed a Piper-spoken question) and whose null sink is the speaker
(its monitor recorded with parec). Needs the Debian packages pulseaudio, pulseaudio-utils,
libasound2-plugins and libportaudio2.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from voice_app.audio.pcm import resample

from ..utterances import UTTERANCES

ROOT = Path(__file__).resolve().parents[3]

MIC_RATE = 16000
FRAME = MIC_RATE // 50  # 20 ms frames into the virtual mic
MODEL_LOAD_TIMEOUT_S = 600.0  # model loading shares 2 cores with everything else the suite runs
REPLY_TIMEOUT_S = 300.0
STORY_AUDIO_S = 120.0  # the longest reply the story request gets, spoken (slower on busy cores), and spare
DEBIAN_PACKAGES = "pulseaudio pulseaudio-utils libasound2-plugins libportaudio2"


def engine_env() -> dict[str, str]:
    """The default model once its draft head is trained; the AR base model until then."""
    if (ROOT / "dllm_engine" / "adapters" / "smollm2-135m-bd.draft-head.safetensors").is_file():
        return {}
    return {"VOICE_APP_ENGINE_MODEL": "smollm2-135m", "VOICE_APP_ENGINE_MODE": "autoregressive"}


# ---- the virtual sound card ------------------------------------------------------------------


class VirtualMic:
    """Writes 16 kHz PCM16 into the pipe source at real-time pace: silence, or what `say` queued."""

    def __init__(self, fifo: Path):
        self._fifo = fifo
        self._pending: list[np.ndarray] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.said_at: float | None = None  # when the queued speech was fully written
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def say(self, samples_16k: np.ndarray) -> None:
        with self._lock:
            self.said_at = None
            self._pending.append(samples_16k.astype("<i2"))

    def _next_frame(self) -> np.ndarray:
        with self._lock:
            if not self._pending:
                return np.zeros(FRAME, dtype="<i2")
            speech = self._pending[0]
            frame, rest = speech[:FRAME], speech[FRAME:]
            self._pending[0] = rest
            if len(rest) == 0:
                self._pending.pop(0)
                self.said_at = time.monotonic()
        return np.pad(frame, (0, FRAME - len(frame)))

    def _run(self) -> None:
        with open(self._fifo, "wb", buffering=0) as pipe:
            next_at = time.monotonic()
            while not self._stop.is_set():
                try:
                    pipe.write(self._next_frame().tobytes())
                except BrokenPipeError:  # the daemon went away (teardown)
                    return
                # Real time from now on, never a catch-up burst: PulseAudio stops reading the
                # pipe while nothing records, and a writer blocked that long (the app loading its
                # models) once delivered the next utterance ~60 s behind schedule, in a burst the
                # input stream partly dropped ("The grants." for "...capital of France?").
                next_at = max(next_at + FRAME / MIC_RATE, time.monotonic() - FRAME / MIC_RATE)
                time.sleep(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def start_pulse(home: Path, *modules: str) -> tuple[subprocess.Popen, dict[str, str]]:
    """A private PulseAudio daemon (runtime files under `home`) with the given modules loaded;
    returns it and the environment that makes clients use it."""
    missing = [tool for tool in ("pulseaudio", "parec", "pactl", "pacat") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: apt-get install -y {DEBIAN_PACKAGES}")
    env = {**os.environ, "HOME": str(home), "PULSE_RUNTIME_PATH": str(home / "run"),
           "PULSE_STATE_PATH": str(home / "state"), "PULSE_CONFIG_PATH": str(home / "config")}
    for inherited in ("PULSE_SERVER", "PULSE_SOURCE", "PULSE_SINK"):
        env.pop(inherited, None)
    log_path = home / "pulseaudio.log"
    with open(log_path, "wb") as log_file:
        daemon = subprocess.Popen(["pulseaudio", "-n", "--daemonize=no", "--exit-idle-time=-1", "--log-target=stderr",
                                   "--load=module-native-protocol-unix", *(f"--load={m}" for m in modules)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=log_file)
    deadline = time.monotonic() + 30
    while subprocess.run(["pactl", "info"], env=env, capture_output=True).returncode != 0:
        if daemon.poll() is not None or time.monotonic() > deadline:
            daemon.kill()
            pytest.fail(f"pulseaudio did not start: {log_path.read_text()[-2000:]}")
        time.sleep(0.1)
    return daemon, env


def stop_pulse(daemon: subprocess.Popen) -> None:
    daemon.send_signal(signal.SIGTERM)
    try:
        daemon.wait(timeout=10)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()


@pytest.fixture(scope="module")
def pulse(tmp_path_factory: pytest.TempPathFactory):
    """Sink `spk` (the speaker, recorded through spk.monitor), pipe source `mic` (the microphone)."""
    home = tmp_path_factory.mktemp("pulse")
    fifo = home / "mic.fifo"  # module-pipe-source creates it
    daemon, env = start_pulse(home, "module-null-sink sink_name=spk",
                              f"module-pipe-source source_name=mic file={fifo} format=s16le rate={MIC_RATE} channels=1")
    mic = VirtualMic(fifo)
    yield {"env": env, "mic": mic}
    mic.stop()
    stop_pulse(daemon)


class SpeakerRecorder:
    """parec on the null sink's monitor: what the assistant said aloud, 16 kHz mono."""

    def __init__(self, env: dict[str, str], path: Path):
        self.path = path
        self._file = open(path, "wb")
        self._proc = subprocess.Popen(["parec", "--device=spk.monitor", "--format=s16le", f"--rate={MIC_RATE}",
                                       "--channels=1", "--raw"], env=env, stdout=self._file)

    def samples(self) -> np.ndarray:
        self._file.flush()
        raw = self.path.read_bytes()
        return np.frombuffer(raw[: len(raw) // 2 * 2], dtype="<i2")

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)
        self._file.close()


class DesktopProcess:
    """`voice-app desktop` as a user runs it, its console lines collected as they come."""

    def __init__(self, env: dict[str, str], *args: str):
        self.lines: list[str] = []
        self.alsa_messages = 0
        self.proc = subprocess.Popen([sys.executable, "-m", "voice_app", "desktop", *args],
                                     env={**env, **engine_env(), "PYTHONUNBUFFERED": "1"}, cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("ALSA lib"):  # libasound's own chatter (underruns): counted, not kept,
                self.alsa_messages += 1  # as a device in trouble can print it in a tight loop
                continue
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, predicate, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if predicate(line):
                    return line
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.1)
        raise AssertionError("no such console line; output so far:\n" + "\n".join(self.lines[-60:]))

    def interrupt(self, timeout_s: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_for_speech_then_silence(recorder: SpeakerRecorder, timeout_s: float, silence_s: float = 2.0) -> np.ndarray:
    """The speaker recording once something was heard and then `silence_s` of quiet followed."""
    deadline = time.monotonic() + timeout_s
    window = int(silence_s * MIC_RATE)
    while time.monotonic() < deadline:
        audio = recorder.samples()
        loud = np.flatnonzero(np.abs(audio.astype(np.int32)) > 1000)
        if len(loud) and len(audio) - loud[-1] > window:
            return audio
        time.sleep(0.25)
    raise AssertionError(f"the speaker never went quiet after speaking (recorded {len(recorder.samples())} samples)")


def words(text: str) -> set[str]:
    return {w.strip(".,!?;:'\"").lower() for w in text.split()} - {""}


# ---- tests -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_spoken_question_is_answered_through_the_speaker(pulse, test_audio, tmp_path):
    from voice_app.settings import Settings
    from voice_app.speech.asr import Transcriber

    question = resample(test_audio["question"].astype(np.float32) / 32768, 24000, MIC_RATE)
    recorder = SpeakerRecorder(pulse["env"], tmp_path / "speaker.raw")
    desktop = DesktopProcess(pulse["env"], "--input-device", "pulse", "--output-device", "pulse")
    try:
        desktop.wait_for_line(lambda line: line.startswith("listening on"), MODEL_LOAD_TIMEOUT_S)
        pulse["mic"].say((np.clip(question, -1, 1) * 32767).astype(np.int16))
        heard_user = desktop.wait_for_line(lambda line: line.startswith("you: ") and "capital" in line.lower(),
                                           REPLY_TIMEOUT_S)
        desktop.wait_for_line(lambda line: "[latency:" in line and "first audio" in line, REPLY_TIMEOUT_S)
        reply_line = desktop.wait_for_line(lambda line: line.startswith("assistant: "), 1)
        speaker_audio = wait_for_speech_then_silence(recorder, REPLY_TIMEOUT_S)
        exit_code = desktop.interrupt()
    finally:
        desktop.kill()
        recorder.stop()

    assert "france" in heard_user.lower()
    assert exit_code == 0 and "stopped" in desktop.lines
    reply_text = reply_line.removeprefix("assistant: ").strip()
    assert len(words(reply_text)) >= 2, reply_line
    settings = Settings()
    transcriber = Transcriber(settings.whisper_model, settings.whisper_compute_type, 1)
    try:
        heard_reply = transcriber.transcribe_blocking(speaker_audio.astype(np.float32) / 32768)
    finally:
        transcriber.close()
    # What came out of the speaker is the reply the console showed (Whisper may miss a word).
    overlap = words(heard_reply) & words(reply_text)
    assert len(overlap) >= 0.5 * len(words(reply_text)), (heard_reply, reply_text)


@pytest.fixture(scope="module")
def echoing_room(pulse, test_audio, tmp_path_factory: pytest.TempPathFactory):
    """A second microphone, `room.monitor`, that hears both what is played into `room` (the
    person) and, 12 dB down and ~60 ms late, everything the speaker `spk` plays (its echo)."""
    env = pulse["env"]
    subprocess.run(["pactl", "load-module", "module-null-sink", "sink_name=room"], env=env, check=True,
                   capture_output=True)
    subprocess.run(["pactl", "load-module", "module-loopback", "source=spk.monitor", "sink=room",
                    "latency_msec=60", "sink_input_properties=media.name=echo"], env=env, check=True,
                   capture_output=True)
    inputs = subprocess.run(["pactl", "list", "short", "sink-inputs"], env=env, check=True, capture_output=True,
                            text=True).stdout.split()
    subprocess.run(["pactl", "set-sink-input-volume", inputs[0], "-12dB"], env=env, check=True)
    folder = tmp_path_factory.mktemp("room")
    wavs = {}
    for name, samples in test_audio.items():
        wavs[name] = folder / f"{name}.raw"
        wavs[name].write_bytes(samples.astype("<i2").tobytes())
    return {"env": {**env, "PULSE_SOURCE": "room.monitor", "PULSE_SINK": "spk"}, "utterances": wavs}


def speak_into_room(room: dict, name: str) -> subprocess.Popen:
    """A person in the room says one of the test utterances (Piper's voice, 24 kHz)."""
    return subprocess.Popen(["pacat", "--playback", "--device=room", "--format=s16le", "--rate=24000",
                             "--channels=1", "--raw", str(room["utterances"][name])], env=room["env"])


def wait_for_speech_after(recorder: SpeakerRecorder, start: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if np.any(np.abs(recorder.samples()[start:].astype(np.int32)) > 1000):
            return
        time.sleep(0.1)
    raise AssertionError("the speaker stayed silent")


def mostly_from(line: str, *texts: str) -> bool:
    heard = words(line.removeprefix("you: "))
    return any(len(heard & words(text)) >= 0.5 * len(heard) for text in texts)


@pytest.mark.slow
def test_the_assistant_does_not_interrupt_itself_but_a_person_can(echoing_room, tmp_path):
    recorder = SpeakerRecorder(echoing_room["env"], tmp_path / "speaker.raw")
    desktop = DesktopProcess(echoing_room["env"], "--input-device", "pulse", "--output-device", "pulse")
    try:
        desktop.wait_for_line(lambda line: line.startswith("listening on"), MODEL_LOAD_TIMEOUT_S)
        speak_into_room(echoing_room, "story").wait(timeout=60)
        # The reply plays through the echoing room and must run to its end on its own. Its
        # console line ends once it is all synthesized (a slow sentence can leave a gap before
        # that); its queued audio plays on after, so then wait for the speaker to fall silent.
        desktop.wait_for_line(lambda line: line.startswith("assistant: "), REPLY_TIMEOUT_S)
        wait_for_speech_then_silence(recorder, REPLY_TIMEOUT_S, silence_s=1.5)
        first_reply_lines = list(desktop.lines)
        speak_into_room(echoing_room, "story").wait(timeout=60)
        wait_for_speech_after(recorder, len(recorder.samples()), REPLY_TIMEOUT_S)
        time.sleep(1.5)  # well into the second reply: now the person talks over it
        speak_into_room(echoing_room, "interrupt").wait(timeout=60)
        desktop.wait_for_line(lambda line: line.startswith("you: ") and "dogs" in line.lower(), REPLY_TIMEOUT_S)
        exit_code = desktop.interrupt()
    finally:
        desktop.kill()
        recorder.stop()
    assert exit_code == 0
    assert any(line.startswith("assistant: ") for line in first_reply_lines), first_reply_lines
    assert not any("[interrupted]" in line for line in first_reply_lines), "\n".join(first_reply_lines)  # not by its echo
    you = [line for line in desktop.lines if line.startswith("you: ")]
    assert all(mostly_from(line, UTTERANCES["story"], UTTERANCES["interrupt"]) for line in you), you  # no echo turns
    assert any("[interrupted]" in line for line in desktop.lines[len(first_reply_lines):]), desktop.lines


@pytest.mark.slow
def test_without_the_echo_gate_the_room_echo_cuts_the_reply(echoing_room):
    """The control: the virtual room's echo is real enough to make the assistant interrupt itself."""
    desktop = DesktopProcess(echoing_room["env"], "--input-device", "pulse", "--output-device", "pulse",
                             "--echo-guard", "off")
    try:
        desktop.wait_for_line(lambda line: line.startswith("listening on"), MODEL_LOAD_TIMEOUT_S)
        speak_into_room(echoing_room, "story").wait(timeout=60)
        # the reply's text line ends when it is generated or cut; its audio (and echo) can play on
        # for a story's length after that, so the cut must come within that much more
        desktop.wait_for_line(lambda line: line.startswith("assistant: "), REPLY_TIMEOUT_S)
        desktop.wait_for_line(lambda line: "[interrupted]" in line, STORY_AUDIO_S)
        assert desktop.interrupt() == 0
    finally:
        desktop.kill()


@pytest.mark.slow
def test_a_sound_server_that_dies_mid_conversation_exits_2_listing_the_devices(tmp_path):
    daemon, env = start_pulse(tmp_path, "module-null-sink sink_name=spk")
    desktop = DesktopProcess({**env, "PULSE_SOURCE": "spk.monitor"}, "--input-device", "pulse",
                             "--output-device", "pulse")
    try:
        desktop.wait_for_line(lambda line: line.startswith("listening on"), MODEL_LOAD_TIMEOUT_S)
        stop_pulse(daemon)  # the "device" goes away under the running streams
        exit_code = desktop.proc.wait(timeout=120)
    finally:
        desktop.kill()
        if daemon.poll() is None:
            stop_pulse(daemon)
    output = "\n".join(desktop.lines)
    assert exit_code == 2, output
    # the stream's end callback, or (when the plugin never calls it) the mic watchdog, says why
    assert "stopped unexpectedly" in output or "delivered no audio" in output, output
    assert "Devices found:" in output and "--input-device" in output


def test_list_devices_shows_the_virtual_card(pulse):
    result = subprocess.run([sys.executable, "-m", "voice_app", "desktop", "--list-devices"], env=pulse["env"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "pulse" in result.stdout


def test_an_unknown_device_name_exits_2_listing_the_devices(pulse):
    result = subprocess.run([sys.executable, "-m", "voice_app", "desktop", "--input-device", "no-such-mic"],
                            env=pulse["env"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "'no-such-mic'" in result.stderr and "pulse" in result.stderr and "--input-device" in result.stderr


def test_no_audio_device_at_all_exits_2_with_how_to_choose(tmp_path):
    # A machine (container) without a sound card, whose PulseAudio plugin finds no server.
    env = {**os.environ, "HOME": str(tmp_path), "PULSE_SERVER": f"unix:{tmp_path}/no-such-socket"}
    env.pop("PULSE_RUNTIME_PATH", None)
    result = subprocess.run([sys.executable, "-m", "voice_app", "desktop"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "no audio devices found" in result.stderr and "--list-devices" in result.stderr
