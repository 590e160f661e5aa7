"""`dllm bench` end to end on a tiny model with a draft head: both modes measured, the head's
block chosen by timing and used, pass costs beside their floors, and the docs block rewritten
in place (the rest of the file kept)."""

from __future__ import annotations

import pytest

from dllm_engine import cli
from dllm_engine.engine import Engine
from kernels import cpu
from test_draft_head import BLOCK, tiny_gguf, with_random_head  # noqa: F401 (tiny_gguf is a fixture)


def test_bench_measures_both_modes_chooses_the_heads_block_and_rewrites_its_docs_block(
        tiny_gguf, tmp_path, monkeypatch, capsys):  # noqa: F811
    loaded = with_random_head(tiny_gguf, tmp_path)
    loaded.draft_head_meta["held_out"] = {"by_offset": [0.5, 0.25, 0.1][:BLOCK - 1]}
    backend = "fused" if cpu.available() is None else "torch"
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **k: Engine(loaded, backend=backend,
                                                                                share_prefixes=False)))
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nkept above\n\n<!-- dllm-bench:start -->\nold\n<!-- dllm-bench:end -->\n\nkept below\n")
    code = cli.main(["bench", "--model", "tiny", "--prompts", "2", "--max-new-tokens", "6", "--concurrency", "1,2",
                     "--write-docs", str(docs)])
    assert code == 0
    out = capsys.readouterr().out
    assert "| ours, diffusion |" in out and "| ours, autoregressive |" in out
    assert "| ours, diffusion (head only) |" in out  # without continuation drafts, in the same run
    head_only_row = next(line for line in out.splitlines() if line.startswith("| ours, diffusion (head only) |"))
    assert "tok/s @2" in out and " - |" not in head_only_row  # every configuration at every level
    assert "diffusion with the head's drafts only / autoregressive speed" in out
    assert "The draft head's block, chosen by a timed decoding step" in out
    assert "| block (exact token + drafts) | 2 | 3 | 4 |" in out
    written = docs.read_text()
    assert "kept above" in written and "kept below" in written and "old" not in written
    assert "| ours, diffusion |" in written
    if backend == "fused":
        assert "| pass / floor |" in out
