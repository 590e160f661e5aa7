"""The KV pool's bookkeeping: reservations, shared prompt heads, copies where prompts diverge,
the cache of ended requests' blocks, and the torch pass's reads and writes over block tables."""

import pytest
import torch

from dllm_engine.models.kv_pool import BlockTable, KVPool, PoolFull

B = 16


def pool(blocks: int = 32, max_idle: int | None = None) -> KVPool:
    return KVPool(layers=3, kv_heads=2, head_dim=8, blocks=blocks, dtype=torch.float32, block_tokens=B,
                  max_idle_blocks=max_idle)


def written(pool_: KVPool, tokens: list[int], has_head: bool = False, limit: int | None = None) -> BlockTable:
    """A table that 'wrote' tokens: each slot's keys hold its token id (so copies can be traced)."""
    table = BlockTable(pool_, len(tokens) + B, has_head=has_head)
    start = pool_.attach_prefix(table, tokens, len(tokens) - 1 if limit is None else limit, has_head)
    table.ensure(len(tokens))
    for layer in range(pool_.layers):
        values = torch.tensor(tokens[start:], dtype=torch.float32).view(-1, 1, 1).expand(-1, 2, 8)
        if len(values):
            table.write(layer, start, values, values)
    return table


def test_a_request_the_pool_cannot_promise_is_refused_and_nothing_is_kept():
    p = pool(blocks=4)
    first = BlockTable(p, 3 * B)
    with pytest.raises(PoolFull, match="1 of its 4 blocks"):
        BlockTable(p, 2 * B)
    first.release()
    assert p.stats()["reserved"] == 0
    BlockTable(p, 4 * B).release()  # all four again


def test_a_published_head_is_listed_not_copied_and_never_written_by_its_sharer():
    p = pool()
    prompt = list(range(100, 150))  # 3 whole blocks and 2 tokens
    first = written(p, prompt)
    p.publish(first, prompt, len(prompt), has_head=False)
    second = BlockTable(p, 80)
    reused = p.attach_prefix(second, prompt + [7, 8], len(prompt) + 1, need_head=False)
    assert reused == 3 * B and second.blocks == first.blocks[:3]
    stats = p.stats()
    assert stats["listed"] == stats["held"] + 3  # three blocks listed twice
    second.ensure(70)
    assert not set(second.blocks[3:]) & set(first.blocks)  # its own positions are its own blocks
    first.release()
    second.release()
    assert p.stats()["held"] == 0 and p.stats()["reserved"] == 0


def test_where_prompts_diverge_inside_a_block_the_common_part_is_copied():
    p = pool()
    prompt = list(range(200, 240))
    first = written(p, prompt)
    p.publish(first, prompt, len(prompt), has_head=False, ended=True)
    other = prompt[:20] + [1, 2, 3, 4, 5]
    second = BlockTable(p, 64)
    assert p.attach_prefix(second, other, len(other) - 1, need_head=False) == 20
    assert second.blocks[0] == first.blocks[0] and second.blocks[1] not in first.blocks
    keys, _ = second.read(0, 20)
    assert keys[0, :, 0].tolist() == [float(t) for t in prompt[:20]]
    # the part-filled last block of an ended request serves a prompt that goes on from it
    longer = prompt + [9, 9]
    third = BlockTable(p, 64)
    assert p.attach_prefix(third, longer, len(longer) - 1, need_head=False) == len(prompt)


def test_a_head_request_takes_only_blocks_that_hold_the_heads_context():
    p = pool()
    prompt = list(range(300, 340))
    plain = written(p, prompt)
    p.publish(plain, prompt, len(prompt), has_head=False)
    head_table = BlockTable(p, 64, has_head=True)
    assert p.attach_prefix(head_table, prompt, len(prompt) - 1, need_head=True) == 0
    with_head = written(p, prompt, has_head=True)
    p.publish(with_head, prompt, len(prompt), has_head=True)
    later = BlockTable(p, 64, has_head=True)
    assert p.attach_prefix(later, prompt, len(prompt) - 1, need_head=True) == 2 * B
    assert later.blocks == with_head.blocks[:2]
    ar = BlockTable(p, 64)  # a request without a head takes either
    assert p.attach_prefix(ar, prompt, len(prompt) - 1, need_head=False) == 2 * B


def test_ended_blocks_stay_cached_up_to_the_limit_and_the_oldest_go_first():
    p = pool(blocks=8, max_idle=2)
    a, b = list(range(0, 32)), list(range(500, 532))
    for prompt in (a, b):
        table = written(p, prompt, limit=0)
        p.publish(table, prompt, len(prompt), has_head=False)
        table.release()
    assert p.stats()["idle"] == 2  # b's two blocks; a's were handed back
    assert p.attach_prefix(BlockTable(p, 48), a + [1], len(a), need_head=False) == 0
    assert p.attach_prefix(BlockTable(p, 48), b + [1], len(b), need_head=False) == 2 * B


def test_an_evicted_block_is_never_listed_for_its_old_tokens():
    p = pool(blocks=3)
    prompt = list(range(40, 72))
    table = written(p, prompt, limit=0)
    p.publish(table, prompt, len(prompt), has_head=False)
    table.release()
    filler = BlockTable(p, 3 * B)  # the free block, then both cached ones: evicted, then rewritten
    filler.ensure(3 * B)
    filler.release()
    assert p.attach_prefix(BlockTable(p, 2 * B), prompt + [1], len(prompt), need_head=False) == 0


def test_torch_reads_and_writes_cross_block_boundaries():
    table = BlockTable.standalone(type("C", (), {"num_layers": 2, "num_kv_heads": 2, "head_dim": 8})(), 40,
                                  torch.float32)
    k = torch.randn(30, 2, 8)
    v = torch.randn(30, 2, 8)
    table.write(1, 5, k, v)
    keys, values = table.read(1, 35)
    assert keys.shape == (2, 35, 8)
    assert torch.equal(keys[:, 5:35], k.transpose(0, 1)) and torch.equal(values[:, 5:35], v.transpose(0, 1))
    with pytest.raises(ValueError, match="do not fit"):
        table.ensure(41)


def test_the_stats_kept_as_blocks_change_equal_a_walk_over_the_pool():
    """held / listed / held_positions are counters (a /metrics scrape reads them without walking
    the pool): through sharing, copies on divergence, releases, the idle cache and its evictions
    they equal what walking every block says."""
    p = pool(blocks=24, max_idle=3)

    def walked() -> dict:
        held = [b for b, refs in enumerate(p._refs) if refs]
        return {"held": len(held), "listed": sum(p._refs), "held_positions": sum(p._fill[b] for b in held)}

    live = []
    for round_ in range(6):
        prompt = list(range(100, 140)) + [round_] * (5 + round_)  # a shared head, then each its own
        table = written(p, prompt)
        p.publish(table, prompt, len(prompt), has_head=False, ended=round_ % 2 == 1)
        live.append(table)
        assert {k: p.stats()[k] for k in ("held", "listed", "held_positions")} == walked()
        if round_ % 2:
            live.pop(0).release()
            assert {k: p.stats()[k] for k in ("held", "listed", "held_positions")} == walked()
    for table in live:
        table.release()
    assert p.stats()["held"] == p.stats()["listed"] == p.stats()["held_positions"] == 0
    head = list(range(500, 532))  # two whole blocks, published, ended, cached idle
    first = written(p, head + [1])
    p.publish(first, head + [1], 33, has_head=False, ended=True)
    first.release()
    revived = written(p, head + [2])  # lists the idle blocks again
    assert p.stats()["held_positions"] > 0
    assert {k: p.stats()[k] for k in ("held", "listed", "held_positions")} == walked()
    revived.release()
