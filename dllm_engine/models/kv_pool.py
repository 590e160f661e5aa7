"""Keys and values in one pool of fixed-size blocks, shared by every request.

The pool holds `blocks` blocks of `block_tokens` positions for every layer (the target's, then a
draft head's), allocated once at load; a request's `BlockTable` lists its blocks in position
order and takes them as its pass first writes there. A voice session submits many prompts with
one long head (a speculative draft per partial transcript, an end-of-turn verdict, the reply,
the next turn): a block whose slots are final and written causally with the base weights
(slot i depends on tokens 0..i alone) is published under a hash of every token up to its end, and
a new request whose prompt starts the same lists that block instead of prefilling it, live or
ended. Blocks are refcounted; a published block nobody lists stays cached, least recently used
first out, up to `max_idle_blocks`. Where a prompt leaves a published block part way, the common
part is copied into the request's own block (copy on write): a shared block is never written,
since a request writes only after its shared head.

A request reserves the blocks of its longest reply when it is made (`PoolFull` when they are not
there), so a pass never runs out of blocks half way.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor

BLOCK_TOKENS = 16
_ROOT = 0  # the chain hash before a prompt's first block


class PoolFull(RuntimeError):
    """The pool cannot promise a request the blocks it may need."""


def common_prefix_len(a, b) -> int:
    length = min(len(a), len(b))
    for i in range(length):
        if a[i] != b[i]:
            return i
    return length


@dataclass(frozen=True)
class _Published:
    key: int | None  # chain hash of the tokens up to the block's end (None: a part-filled block)
    parent: int  # chain hash of the tokens before the block
    tokens: tuple[int, ...]
    has_head: bool  # a draft head's layers hold its context too


class KVPool:
    """Keys [layers, kv_heads, blocks, head_dim, block_tokens] and values [layers, kv_heads, blocks,
    block_tokens, head_dim], and who holds which block. A block's keys are stored transposed
    (dimension-major): the fused pass scores a block's keys for several queries at once, one
    dimension of 8 or 16 keys per vector, with no sums across lanes (kernels/cpu/csrc/attention.cpp).
    A kv head's blocks sit side by side, so the blocks a request takes in a row (a fresh request's
    are consecutive) are one run of memory: attention streams them. `write` and `gather` are the
    torch side's only way in, so the layout is known here and in the C++ pass alone.
    Thread-safe: requests reserve from the callers' threads, the scheduler thread does the rest."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, blocks: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", block_tokens: int = BLOCK_TOKENS,
                 max_idle_blocks: int | None = None):
        if blocks < 1 or block_tokens < 8 or block_tokens % 8:
            raise ValueError(f"a KV pool needs >= 1 block of a multiple of 8 positions, got {blocks} x {block_tokens}")
        # untouched pages cost no memory: what is resident is the blocks used so far
        self.k = torch.empty(layers, kv_heads, blocks, head_dim, block_tokens, dtype=dtype, device=device)
        self.v = torch.empty(layers, kv_heads, blocks, block_tokens, head_dim, dtype=dtype, device=device)
        self.blocks, self.layers, self.block_tokens = blocks, layers, block_tokens
        self.max_idle_blocks = blocks if max_idle_blocks is None else max_idle_blocks
        self._refs = [0] * blocks
        self._fill = [0] * blocks  # leading slots written (the unique positions a block holds)
        # stats() kept as each block changes (a /metrics scrape must not walk the pool under the lock)
        self._held = self._listed = self._held_positions = 0
        self._free = list(range(blocks - 1, -1, -1))  # a stack: the most recently freed block is reused first
        self._idle: OrderedDict[int, None] = OrderedDict()  # published, listed by nobody, oldest first
        self._published: dict[int, _Published] = {}
        self._by_key: dict[int, int] = {}  # chain hash -> the full block published under it
        self._after: dict[int, set[int]] = {}  # chain hash -> published blocks that follow it
        self._reserved = 0
        self._lock = threading.Lock()

    @classmethod
    def for_tokens(cls, config, tokens: int, dtype: torch.dtype, device: torch.device | str = "cpu",
                   extra_layers: int = 0, block_tokens: int = BLOCK_TOKENS, idle_bytes: int = 256 << 20) -> "KVPool":
        """A pool of `tokens` positions for a model (and `extra_layers` of a draft head); at most
        `idle_bytes` of published blocks stay cached for later prompts."""
        layers = config.num_layers + extra_layers
        blocks = max(1, -(-tokens // block_tokens))
        block_bytes = 2 * layers * config.num_kv_heads * block_tokens * config.head_dim * dtype.itemsize
        return cls(layers, config.num_kv_heads, config.head_dim, blocks, dtype, device, block_tokens,
                   max_idle_blocks=idle_bytes // block_bytes)

    # ---- what it holds ----------------------------------------------------------------------------
    @property
    def block_bytes(self) -> int:
        return 2 * self.k[:, :, 0].numel() * self.k.element_size()

    def stats(self) -> dict[str, int]:
        """held: blocks some request lists; listed: table entries in all (> held where blocks are
        shared); held_positions: the positions written in held blocks (each once, however many list
        it); idle: published blocks cached for later prompts; reserved: promised, not taken."""
        with self._lock:
            return {"blocks": self.blocks, "held": self._held, "listed": self._listed,
                    "held_positions": self._held_positions, "idle": len(self._idle),
                    "reserved": self._reserved, "block_bytes": self.block_bytes, "block_tokens": self.block_tokens}

    # ---- the torch side's reads and writes -----------------------------------------------------------
    def write(self, layer: int, blocks: Tensor, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """k, v [n, kv_heads, head_dim] into pool layer `layer` at (blocks[i], slots[i])."""
        self.k[layer][:, blocks, :, slots] = k.to(self.k.dtype)  # apart, the indexed dims lead: [n, kv_heads, d]
        self.v[layer][:, blocks, slots] = v.transpose(0, 1).to(self.v.dtype)

    def gather(self, layer: int, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of blocks `ids` (any shape) at pool layer `layer`, both
        [kv_heads, *ids.shape, block_tokens, head_dim]."""
        return self.k[layer][:, ids].transpose(-1, -2), self.v[layer][:, ids]

    # ---- reservations and blocks ------------------------------------------------------------------
    def reserve(self, blocks: int) -> None:
        with self._lock:
            available = len(self._free) + len(self._idle) - self._reserved
            if blocks > available:
                raise PoolFull(f"the KV pool has {max(0, available)} of its {self.blocks} blocks of "
                               f"{self.block_tokens} positions to promise; this request may need {blocks}")
            self._reserved += blocks

    def unreserve(self, blocks: int) -> None:
        with self._lock:
            self._reserved -= blocks

    def take(self) -> int:
        """A block for a reservation already made (its content is undefined)."""
        with self._lock:
            self._reserved -= 1
            return self._take_locked()

    def release(self, blocks: list[int]) -> None:
        with self._lock:
            for block in blocks:
                self._refs[block] -= 1
                self._listed -= 1
                if self._refs[block]:
                    continue
                self._held -= 1
                self._held_positions -= self._fill[block]
                if block in self._published:
                    self._idle[block] = None
                else:
                    self._free.append(block)
            while len(self._idle) > self.max_idle_blocks:
                self._free.append(self._evict_oldest())

    def filled(self, block: int, slots: int) -> None:
        """A pass writes slots [0, slots) of the block (a block some table holds)."""
        with self._lock:
            self._set_fill(block, max(self._fill[block], slots))

    def _set_fill(self, block: int, slots: int) -> None:
        self._held_positions += slots - self._fill[block]
        self._fill[block] = slots

    def _take_locked(self) -> int:
        block = self._free.pop() if self._free else self._evict_oldest()
        self._refs[block] = 1
        self._fill[block] = 0
        self._held += 1
        self._listed += 1
        return block

    def _evict_oldest(self) -> int:
        if not self._idle:
            raise PoolFull("the KV pool has no free block (a reservation was not kept)")
        block, _ = self._idle.popitem(last=False)
        meta = self._published.pop(block)
        if meta.key is not None and self._by_key.get(meta.key) == block:
            del self._by_key[meta.key]
        self._after[meta.parent].discard(block)
        if not self._after[meta.parent]:
            del self._after[meta.parent]
        return block

    def _hold(self, block: int) -> None:
        if not self._refs[block]:
            self._held += 1
            self._held_positions += self._fill[block]
        self._refs[block] += 1
        self._listed += 1
        self._idle.pop(block, None)

    # ---- sharing ----------------------------------------------------------------------------------
    def attach_prefix(self, table: "BlockTable", token_ids: list[int], limit: int, need_head: bool) -> int:
        """Lists in an empty table the published blocks holding the head of `token_ids` (at most
        `limit` tokens), then copies the common part of the best published block where the prompt
        leaves them; returns how many positions now hold final keys and values."""
        B = self.block_tokens
        with self._lock:
            parent = _ROOT
            while len(table.blocks) * B + B <= limit:
                start = len(table.blocks) * B
                chunk = tuple(token_ids[start:start + B])
                key = hash((parent, chunk))
                block = self._by_key.get(key)
                meta = self._published.get(block)
                if meta is None or meta.tokens != chunk or meta.parent != parent or (need_head and not meta.has_head):
                    break
                self._hold(block)
                table._adopt(block, key)
                self._reserved -= 1  # the table's reservation counted this block
                parent = key
            start = len(table.blocks) * B
            wanted = token_ids[start:min(limit, start + B)]
            best, best_len = None, 0
            for block in self._after.get(parent, ()):
                meta = self._published[block]
                length = common_prefix_len(meta.tokens, wanted)
                if length > best_len and (meta.has_head or not need_head):
                    best, best_len = block, length
            if best is None:
                return start
            self._reserved -= 1
            own = self._take_locked()
            self.k[:, :, own, :, :best_len] = self.k[:, :, best, :, :best_len]  # under the lock: `best` stays put
            self.v[:, :, own, :best_len] = self.v[:, :, best, :best_len]
            self._set_fill(own, best_len)
        table._adopt(own, None)
        return start + best_len

    def publish(self, table: "BlockTable", token_ids: list[int], length: int, has_head: bool,
                ended: bool = False) -> None:
        """Positions [0, length) of the table hold final causal keys and values of token_ids (and a
        draft head's context where has_head): its whole blocks there become shareable, and when the
        request has `ended`, the part-filled block after them too (for prompts that leave it there)."""
        B = self.block_tokens
        with self._lock:
            while len(table.keys) < min(length // B, len(table.blocks)):
                index = len(table.keys)
                parent = table.keys[-1] if table.keys else _ROOT
                chunk = tuple(token_ids[index * B:(index + 1) * B])
                key = hash((parent, chunk))
                block = table.blocks[index]
                if block not in self._published:
                    current = self._by_key.get(key)
                    if current is None or (has_head and not self._published[current].has_head):
                        self._by_key[key] = block
                    self._publish_locked(block, _Published(key, parent, chunk, has_head))
                table.keys.append(key)
            tail = length - len(table.keys) * B
            if ended and 0 < tail < B and len(table.blocks) > len(table.keys):
                block = table.blocks[len(table.keys)]
                if block not in self._published:
                    parent = table.keys[-1] if table.keys else _ROOT
                    start = len(table.keys) * B
                    self._publish_locked(block, _Published(None, parent, tuple(token_ids[start:length]), has_head))

    def _publish_locked(self, block: int, meta: _Published) -> None:
        self._published[block] = meta
        self._after.setdefault(meta.parent, set()).add(block)


class BlockTable:
    """One request's keys and values: its blocks of a pool in position order, up to `max_len`
    positions (reserved when made). `layer0`: the pool layer of the reader's layer 0 (a draft
    head reads its own layers, after the target's: `view`)."""

    def __init__(self, pool: KVPool, max_len: int, has_head: bool = False):
        self.pool, self.max_len, self.has_head = pool, max_len, has_head
        self.layer0 = 0
        self.blocks: list[int] = []
        self.keys: list[int] = []  # chain hashes of its published leading blocks
        self._reserved = -(-max_len // pool.block_tokens)
        pool.reserve(self._reserved)
        self._ids: Tensor | None = None  # the blocks as a tensor, made once per change
        self._full_blocks = 0  # leading blocks its passes have filled
        self._released = False

    @classmethod
    def standalone(cls, config, max_len: int, dtype: torch.dtype, device: torch.device | str = "cpu",
                   extra_layers: int = 0, block_tokens: int = BLOCK_TOKENS) -> "BlockTable":
        """A table over a pool of its own, every block taken (tests, benches, training features)."""
        pool = KVPool.for_tokens(config, max_len, dtype, device, extra_layers, block_tokens)
        table = cls(pool, max_len, has_head=extra_layers > 0)
        table.ensure(max_len)
        return table

    def _adopt(self, block: int, key: int | None) -> None:
        self.blocks.append(block)
        self._reserved -= 1
        if key is not None:
            self.keys.append(key)
        self._ids = None

    @property
    def dtype(self) -> torch.dtype:
        return self.pool.k.dtype

    @property
    def bytes(self) -> int:
        """Keys and values of the blocks it lists (shared ones included)."""
        return len(self.blocks) * self.pool.block_bytes

    def ids(self) -> Tensor:
        """Its blocks as an int64 CPU tensor (the same tensor until the table grows: the fused
        pass tells two segments of one request by it)."""
        if self._ids is None:
            self._ids = torch.tensor(self.blocks, dtype=torch.long)
        return self._ids

    def ensure(self, end: int) -> None:
        """Blocks for positions [0, end), from the reservation."""
        if end > self.max_len or self._released:
            raise ValueError(f"positions up to {end} do not fit a KV table of {self.max_len}"
                             + (" (released)" if self._released else ""))
        B = self.pool.block_tokens
        while len(self.blocks) * B < end:
            self._adopt(self.pool.take(), None)
        for index in range(self._full_blocks, end // B):  # what a pass writes up to end
            self.pool.filled(self.blocks[index], B)
        self._full_blocks = max(self._full_blocks, end // B)
        if end % B:
            self.pool.filled(self.blocks[end // B], end % B)

    def release(self) -> None:
        """Gives its blocks and what is left of its reservation back (once)."""
        if self._released:
            return
        self._released = True
        self.pool.release(self.blocks)
        self.pool.unreserve(self._reserved)
        self.blocks, self.keys, self._reserved, self._ids = [], [], 0, None

    def view(self, first: int) -> "BlockTable":
        """The same blocks read from pool layer `first` on (a draft head's own layers)."""
        return _LayerView(self, first)

    # ---- the torch pass's reads and writes ---------------------------------------------------------
    def write(self, layer: int, start: int, k: Tensor, v: Tensor) -> None:
        """k, v [n, kv_heads, head_dim] of positions start.. at `layer`."""
        self.ensure(start + k.shape[0])
        B, device = self.pool.block_tokens, self.pool.k.device
        positions = torch.arange(start, start + k.shape[0])
        blocks = self.ids()[positions // B].to(device)
        slots = (positions % B).to(device)
        self.pool.write(self.layer0 + layer, blocks, slots, k, v)

    def read(self, layer: int, end: int) -> tuple[Tensor, Tensor]:
        """Keys and values [kv_heads, end, head_dim] of positions [0, end) at `layer`."""
        B = self.pool.block_tokens
        ids = self.ids()[:-(-end // B)].to(self.pool.k.device)
        keys, values = self.pool.gather(self.layer0 + layer, ids)  # [kv_heads, n, B, head_dim]
        return keys.flatten(1, 2)[:, :end], values.flatten(1, 2)[:, :end]


class _LayerView(BlockTable):
    """A table's blocks at other layers (shares its blocks; never reserves or releases)."""

    def __init__(self, table: BlockTable, first: int):
        # not BlockTable.__init__: that would reserve blocks of its own
        self._table, self.pool, self.max_len, self.has_head = table, table.pool, table.max_len, table.has_head
        self.layer0 = table.layer0 + first

    @property
    def blocks(self) -> list[int]:
        return self._table.blocks

    def ids(self) -> Tensor:
        return self._table.ids()

    def ensure(self, end: int) -> None:
        self._table.ensure(end)

    def release(self) -> None:
        raise TypeError("a layer view does not own its blocks")
