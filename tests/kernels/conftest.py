"""Kernel tests run every Triton kernel on CPU tensors in Triton's interpreter.

Triton decides interpreted-or-compiled when a kernel is decorated, i.e. when a module of
kernels.triton_ops is first imported, so the variable is set here, before any test runs.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def seeded() -> None:
    torch.manual_seed(1234)


@pytest.fixture
def poisoned_outputs(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """torch.empty / empty_like return sentinel-filled tensors (NaN for floats, -7 for ints,
    the param for bools), so an output element a kernel never writes shows up in the results."""
    fill_bool = getattr(request, "param", True)
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def sentinel(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dtype == torch.bool:
            return tensor.fill_(fill_bool)
        return tensor.fill_(float("nan") if tensor.dtype.is_floating_point else -7)

    monkeypatch.setattr(torch, "empty", lambda *a, **k: sentinel(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: sentinel(real_empty_like(*a, **k)))
