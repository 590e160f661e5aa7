"""`dllm bench`'s report: the markdown table of a run's results and the block of
docs/benchmarks.md it rewrites (dllm_engine/bench.py measures)."""

from __future__ import annotations

from pathlib import Path

_START, _END = "<!-- dllm-bench:start -->", "<!-- dllm-bench:end -->"


def format_table(report: dict) -> str:
    results = report["results"]
    levels = list(next(iter(results.values()))["concurrency"])
    lines = [
        f"model `{report['model']}` ({report['backend']} pass, {report['activations']} activations, "
        f"{report['dtype']} keys and values, kernel "
        f"{report['kernel']}, {report['machine']}; CPU flags: {' '.join(report['cpu_flags']) or 'unknown'}), "
        f"{report['prompts']} prompts, max {report['max_new_tokens']} new tokens, block {report['block_size']}, "
        f"commits: {report['threshold']}",
        "",
        "| engine | tok/s (1 req) | tokens/pass | ms/pass | first sentence (s) | full reply (s) | "
        + " | ".join(f"tok/s @{c}" for c in levels) + " | " + " | ".join(f"ms/pass @{c}" for c in levels) + " |",
        "|---" * (6 + 2 * len(levels)) + "|",
    ]
    for mode, r in results.items():
        conc = " | ".join(f"{p['tokens_per_s']:.1f}" for p in r["concurrency"].values())
        conc_ms = " | ".join(f"{p['ms_per_pass']:.1f}" for p in r["concurrency"].values())
        lines.append(f"| ours, {mode} | {r['tokens_per_s']:.1f} | {r['tokens_per_forward']:.2f} | {r['ms_per_pass']:.1f} | "
                     f"{r['median_first_sentence_s']:.2f} | {r['median_full_reply_s']:.2f} | {conc} | {conc_ms} |")
    if "llama_cpp" in report:
        p = report["llama_cpp"]
        blank = " | ".join("-" for _ in levels)
        lines.append(f"| llama.cpp (same GGUF) | {p['tokens_per_s']:.1f} | 1.00 | {1000 / p['tokens_per_s']:.1f} | "
                     f"{p['median_first_sentence_s']:.2f} | {p['median_full_reply_s']:.2f} | {blank} | {blank} |")
    lines.append("")
    for key, label in (("diffusion_vs_ar_speed", "diffusion / autoregressive speed"),
                       ("head_only_vs_ar_speed", "diffusion with the head's drafts only / autoregressive speed"),
                       ("diffusion_vs_ar_pass", "diffusion pass / autoregressive pass"),
                       ("ar_vs_llamacpp_speed", "autoregressive / llama.cpp speed"),
                       ("best_vs_llamacpp_speed", "best mode / llama.cpp speed")):
        if key in report:
            lines.append(f"- {label}: **{report[key]:.2f}x**")
    if report.get("draft_blocks"):
        rows = report["draft_blocks"]["blocks"]
        lines += ["", f"The draft head's block, chosen by a timed decoding step (verify pass + head step, one "
                  f"request, 128-token context) and the head's held-out acceptance: **{report['draft_blocks']['chosen']}**",
                  "", "| block (exact token + drafts) | " + " | ".join(str(r["block"]) for r in rows) + " |",
                  "|---" * (1 + len(rows)) + "|",
                  "| ms per step | " + " | ".join(f"{r['ms']:.1f}" for r in rows) + " |",
                  "| tokens per pass (held-out) | " + " | ".join(f"{r['tokens_per_pass']:.2f}" for r in rows) + " |",
                  "| tokens per second | " + " | ".join(f"{r['tokens_per_s']:.0f}" for r in rows) + " |"]
    if report.get("pass_costs"):
        costs = report["pass_costs"]
        lines += ["", "One pass by the rows it carries (a verify pass: causal rows; head on every row), "
                  "200 cached tokens, ms (the median of 10 passes, the best of 4 rounds over the sizes in turn), "
                  "beside its floor:", "",
                  "| rows in the pass | " + " | ".join(str(c["tokens"]) for c in costs) + " |",
                  "|---" * (1 + len(costs)) + "|",
                  "| ms per pass | " + " | ".join(f"{c['ms']:.1f}" for c in costs) + " |",
                  "| floor ms | " + " | ".join(f"{c['floor_ms']:.1f} ({c['floor_bound'][0]})" for c in costs) + " |",
                  "| pass / floor | " + " | ".join(f"{c['vs_floor']:.2f}x" for c in costs) + " |",
                  "| pass / 1-token pass | " + " | ".join(f"{c['ms'] / costs[0]['ms']:.2f}x" for c in costs) + " |",
                  "", f"(b: bandwidth floor, {report['read_bandwidth_gbs']:.1f} GB/s read measured in this run; "
                  + (f"c: compute floor, {report['int8_gmacs']:.0f} G int8 multiply-adds/s of the {report['kernel']} "
                     f"kernel in this run" if report.get("int8_gmacs") else
                     f"c: compute floor, {report['fma_gmacs']:.1f} G fp32 multiply-adds/s of a large matmul in this run")
                  + f"; rows that ride free while the weights stream, by those two rates: "
                  f"~{report['free_rows_estimate']:.1f})"]
        lines += _phase_rows(costs)
    return "\n".join(lines)


def _phase_rows(costs: list[dict]) -> list[str]:
    """Where the fused pass's time goes, phase by phase (ms per pass), for each pass size."""
    phases = [phase for phase in costs[0].get("phases_ms", {}) if any(c["phases_ms"][phase] >= 0.05 for c in costs)]
    if not phases:
        return []
    return (["", "Where a fused pass goes, ms per pass by phase (the pass's own timers):", "",
             "| phase | " + " | ".join(str(c["tokens"]) for c in costs) + " |", "|---" * (1 + len(costs)) + "|"]
            + [f"| {phase} | " + " | ".join(f"{c['phases_ms'][phase]:.2f}" for c in costs) + " |" for phase in phases])


def write_docs(path: Path, table: str, report: dict, args) -> None:
    command = (f"dllm bench --model {report['model']} --prompts {report['prompts']} --max-new-tokens "
               f"{report['max_new_tokens']} --concurrency {args.concurrency}"
               + (f" --peer {args.peer}" if args.peer else "") + (f" --backend {args.backend}" if args.backend != "auto" else ""))
    block = f"{_START}\n<!-- written by `dllm bench`; rerun it to refresh -->\nCommand: `{command}`\n\n{table}\n{_END}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if _START in text and _END in text:
        text = text[:text.index(_START)] + block + text[text.index(_END) + len(_END):]
    else:
        text = text.rstrip() + "\n\n## Engine (`dllm bench`)\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
