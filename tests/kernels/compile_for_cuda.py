"""Compile every Triton kernel of kernels/ to a CUDA binary, without a GPU.

Run as a script (by test_cuda_compile.py, in a subprocess without TRITON_INTERPRET): the
interpreter never lowers a kernel, so type and layout errors that only the compiler sees
would otherwise wait for the first GPU. Uses the ptxas shipped in the triton wheel.
Prints one line per kernel variant: name, target, dtype, shared memory bytes.
"""

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels.triton_ops import block_attention, commit_selection, head_confidence  # noqa: E402

# Shared memory per block on the smallest target we care about (A100, sm_80).
A100_SHARED_BYTES = 164 * 1024


def compile_kernel(fn, pointer_types: dict[str, str], constexprs: dict, capability: int, num_stages: int = 3):
    """Arguments not named in pointer_types or constexprs are int32 scalars."""
    signature = {
        name: "constexpr" if name in constexprs else pointer_types.get(name, "i32") for name in fn.arg_names
    }
    source = ASTSource(fn, signature, constexprs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_stages": num_stages})


def variants(capability: int):
    for dtype, precision in (("bf16", "tf32"), ("fp16", "tf32"), ("fp32", "ieee")):
        dots = {"DOT_PRECISION": precision, "UPCAST_DOT": False}
        yield head_confidence._slice_stats_kernel, dtype, 3, {
            "hidden_ptr": f"*{dtype}", "weight_ptr": f"*{dtype}", "max_ptr": "*fp32", "sum_ptr": "*fp32",
            "wsum_ptr": "*fp32", "arg_ptr": "*i64", "temperature": "fp32",
        }, {"BLOCK_N": 64, "BLOCK_V": head_confidence.BLOCK_V, "BLOCK_H": head_confidence.BLOCK_H, **dots}
        # fp32 attention (2 stages, as launched) compiles in ~10 s: once, on the smaller GPU.
        if dtype != "fp32" or capability == 80:
            yield block_attention._block_attention_kernel, dtype, 2 if dtype == "fp32" else 3, {
                "q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "v_ptr": f"*{dtype}", "prefix_ptr": "*i64",
                "out_ptr": f"*{dtype}", "scale_log2": "fp32",
            }, {"BLOCK_M": 64, "BLOCK_N": block_attention.BLOCK_N, "BLOCK_D": 128, **dots}
    yield head_confidence._merge_slices_kernel, "fp32", 3, {
        "max_ptr": "*fp32", "sum_ptr": "*fp32", "wsum_ptr": "*fp32", "arg_ptr": "*i64",
        "token_ptr": "*i64", "prob_ptr": "*fp32", "entropy_ptr": "*fp32",
    }, {"BLOCK_S": 512}
    for has_force in (False, True):
        yield commit_selection._select_commits_kernel, "fp32", 3, {
            "conf_ptr": "*fp32", "masked_ptr": "*i1", "threshold_ptr": "*fp32", "commit_ptr": "*i1",
            "force_ptr": "*i64",
        }, {"BLOCK_B": 64, "HAS_FORCE": has_force}


def main() -> int:
    failures = 0
    for capability in (80, 90):
        for fn, dtype, stages, pointers, constexprs in variants(capability):
            compiled = compile_kernel(fn, pointers, constexprs, capability, stages)
            shared = compiled.metadata.shared
            fits = shared <= A100_SHARED_BYTES
            failures += not fits
            print(f"{fn.__name__} sm_{capability} {dtype} shared={shared} {'ok' if fits else 'TOO MUCH SHARED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
