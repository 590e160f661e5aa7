"""Which implementation runs: the device decides under 'auto'; Triton stays optional."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.dispatch import resolve_backend
from kernels.triton_ops.head_confidence import _slice_stats_kernel

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_auto_runs_the_reference_on_cpu():
    assert resolve_backend("auto", torch.device("cpu"), "op") == "reference"


def test_forced_backends_are_honoured_under_the_interpreter():
    assert resolve_backend("reference", torch.device("cpu"), "op") == "reference"
    assert resolve_backend("triton", torch.device("cpu"), "op") == "triton"


def test_kernels_under_test_are_interpreted():
    # If a kernel module was imported before TRITON_INTERPRET=1 was set, the tests above
    # would not be exercising the interpreter at all.
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(_slice_stats_kernel, InterpretedFunction)


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("cuda", torch.device("cpu"), "confidence_head")


def run_python(code: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), **env_extra}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_triton_on_cpu_without_the_interpreter_is_refused():
    code = (
        "import torch, kernels\n"
        "try:\n"
        "    kernels.confidence_head(torch.randn(2, 4), torch.randn(8, 4), backend='triton')\n"
        "except RuntimeError as error:\n"
        "    print('refused:', error)\n"
    )
    result = run_python(code, {"TRITON_INTERPRET": "0"})
    assert "refused:" in result.stdout and "TRITON_INTERPRET=1" in result.stdout, result.stderr


def test_everything_works_without_triton_installed():
    # A meta-path finder that hides triton, as on a machine where it is not installed.
    code = (
        "import sys, importlib.abc\n"
        "class HideTriton(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'triton' or name.startswith('triton.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, HideTriton())\n"
        "import torch, kernels\n"
        "token, prob, entropy = kernels.confidence_head(torch.randn(3, 8), torch.randn(20, 8))\n"
        "commit = kernels.select_commits(torch.rand(2, 4), torch.ones(2, 4, dtype=torch.bool), torch.rand(2))\n"
        "out = kernels.block_attention(torch.randn(1, 2, 3, 8), torch.randn(1, 1, 9, 8), torch.randn(1, 1, 9, 8), torch.tensor([2]))\n"
        "print('shapes', tuple(token.shape), tuple(commit.shape), tuple(out.shape))\n"
        "try:\n"
        "    kernels.confidence_head(torch.randn(3, 8), torch.randn(20, 8), backend='triton')\n"
        "except RuntimeError as error:\n"
        "    print('refused:', error)\n"
        "print('triton imported:', 'triton' in sys.modules)\n"
    )
    result = run_python(code, {"TRITON_INTERPRET": "1"})
    assert "shapes (3,) (2, 4) (1, 2, 3, 8)" in result.stdout, result.stderr
    assert "refused: confidence_head: backend='triton' needs the triton package" in result.stdout
    assert "triton imported: False" in result.stdout


def test_triton_on_cpu_is_refused_once_the_interpreter_variable_is_gone(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        resolve_backend("triton", torch.device("cpu"), "block_attention")
