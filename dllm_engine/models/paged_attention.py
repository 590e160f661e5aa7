"""The torch pass's attention over block tables: every segment of a pass in one batched call a
layer, its keys and values written to and read from the KV pool's blocks (models/kv_pool.py).

A pass's segments are padded to one [segments, rows, keys] shape: each segment's rows are its
queries, its table's blocks up to its `attend_len` are its keys, and a mask says which key each
row may see (its `visibility`). This is the seam a GPU backend's varlen attention over block
tables fills. A request whose later segment overwrites slots its earlier segment wrote and
attends to (a drafted block over the checked drafts) puts them in successive waves, each wave
writing before it attends, as the fused pass does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_engine.models.kv_pool import KVPool
from kernels.block_attention import batched_grouped_attention


@dataclass
class _Wave:
    pool: KVPool
    layer0: int
    rows: Tensor  # [R] the packed rows whose keys and values this wave writes...
    blocks: Tensor  # [R] ...into these blocks
    slots: Tensor  # [R] ...at these slots
    queries: Tensor  # [S, T] each segment's packed rows, padded with row 0
    valid: Tensor  # [S, T] which of those are its rows
    key_blocks: Tensor  # [S, nb] each segment's blocks up to its attend_len, padded with block 0
    written: Tensor  # [S, nb * block_tokens] which keys hold its written positions
    mask: Tensor  # [S, T, nb * block_tokens] which keys each row may see


class PagedAttention:
    """Attention for one pass over `segments` (their tables hold every block they attend to)."""

    def __init__(self, segments: list, device: torch.device | str):
        groups: dict[tuple[int, int, int], list] = {}
        seen: dict[int, int] = {}
        row0 = 0
        for segment in segments:
            table = segment.cache
            wave = seen.get(id(table), 0)
            seen[id(table)] = wave + 1
            groups.setdefault((wave, id(table.pool), table.layer0), []).append((row0, segment))
            row0 += segment.tokens.numel()
        self.waves = [_wave(group, device) for _, group in sorted(groups.items(), key=lambda item: item[0][0])]

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q [N, Hq, D], k and v [N, Hkv, D] of the pass's rows -> attention output [N, Hq * D]."""
        out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
        for wave in self.waves:
            pool_layer = wave.layer0 + layer
            wave.pool.write(pool_layer, wave.blocks, wave.slots, k[wave.rows], v[wave.rows])
            hidden = ~wave.written[:, None, :, None]  # slots never written may hold anything (NaN too)

            def ready(blocks: Tensor) -> Tensor:  # [Hkv, S, nb, B, D] -> [S, Hkv, nb * B, D]
                return blocks.transpose(0, 1).flatten(2, 3).to(q.dtype).masked_fill(hidden, 0)

            keys, values = wave.pool.gather(pool_layer, wave.key_blocks)
            result = batched_grouped_attention(q[wave.queries], ready(keys), ready(values), wave.mask)
            out[wave.queries[wave.valid]] = result[wave.valid].to(out.dtype)
        return out


def _key_limits(segment) -> Tensor:
    """Keys [0, limit) each row of the segment may see (transformer.Segment's visibility)."""
    n, start = segment.tokens.numel(), segment.start
    rows = torch.arange(n)
    if segment.visibility == "causal":
        return start + rows + 1
    if segment.visibility == "blocks":
        return torch.clamp(start + (rows // segment.block_size + 1) * segment.block_size, max=segment.attend_len)
    return torch.full((n,), segment.attend_len)


def _wave(group: list, device: torch.device | str) -> _Wave:
    table = group[0][1].cache
    B = table.pool.block_tokens
    most_rows = max(segment.tokens.numel() for _, segment in group)
    most_blocks = max(-(-segment.attend_len // B) for _, segment in group)
    count = len(group)
    queries = torch.zeros(count, most_rows, dtype=torch.long)
    valid = torch.zeros(count, most_rows, dtype=torch.bool)
    key_blocks = torch.zeros(count, most_blocks, dtype=torch.long)
    limits = torch.ones(count, most_rows, dtype=torch.long)  # padding rows see key 0 (their output is dropped)
    attend = torch.zeros(count, 1, dtype=torch.long)
    rows, blocks, slots = [], [], []
    for index, (row0, segment) in enumerate(group):
        n, ids = segment.tokens.numel(), segment.cache.ids()
        positions = torch.arange(segment.start, segment.start + n)
        rows.append(torch.arange(row0, row0 + n))
        blocks.append(ids[positions // B])
        slots.append(positions % B)
        queries[index, :n] = rows[-1]
        valid[index, :n] = True
        used = -(-segment.attend_len // B)
        key_blocks[index, :used] = ids[:used]
        limits[index, :n] = _key_limits(segment)
        attend[index] = segment.attend_len
    keys = torch.arange(most_blocks * B)
    move = lambda t: t.to(device)  # noqa: E731
    return _Wave(table.pool, table.layer0, move(torch.cat(rows)), move(torch.cat(blocks)), move(torch.cat(slots)),
                 move(queries), move(valid), move(key_blocks), move(keys[None] < attend),
                 move(keys[None, None] < limits[..., None]))
