"""Kernel tests run every Triton kernel on CPU tensors in Triton's interpreter.

Triton decides interpreted-or-compiled when a kernel is decorated, i.e. when a module of
kernels.triton_ops is first imported. So the kernels are imported here, at collection,
with TRITON_INTERPRET=1. The interpreter reads the variable again while it runs a kernel,
so each kernel test sets it for its own duration; outside these tests it is put back, so
that servers and engines other tests start in subprocesses (on a GPU machine) do not
inherit the interpreter.
"""

import os

_saved_interpret = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"
try:
    import kernels.triton_ops.block_attention
    import kernels.triton_ops.commit_selection
    import kernels.triton_ops.head_confidence  # noqa: F401
finally:
    if _saved_interpret is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = _saved_interpret

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def interpreter_and_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
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
