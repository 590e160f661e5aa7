"""The drafter's training batch has the shape the engine decodes: a fully masked block at each
anchor, seeing the exact tokens before it, row j drafting the token j + 1 after the anchor."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_engine.training.objective import IGNORE, loss_on, make_batch

MASK, EOS = 99, 2
RECORD = {"prompt_ids": [1, 5, 6], "reply_ids": [10, 11, 12, 13], "finished": True}


def _batch(records=(RECORD,), block_size=4, anchors=100):
    return make_batch(list(records), block_size, anchors, MASK, EOS, torch.Generator().manual_seed(0), gamma=2.0)


def test_every_reply_position_anchors_a_masked_block_that_drafts_the_tokens_after_it():
    batch = _batch()
    sequence = RECORD["prompt_ids"] + RECORD["reply_ids"] + [EOS]
    assert batch.clean[0].tolist() == sequence
    assert (batch.noisy == MASK).all()
    positions = batch.noisy_positions[0].view(-1, 4)
    assert positions[:, 0].tolist() == [3, 4, 5, 6]  # each reply position but EOS anchors a block
    first = dict(zip(positions[0].tolist(), batch.targets[0, :4].tolist()))
    assert first == {3: 11, 4: 12, 5: 13, 6: IGNORE}  # row j drafts anchor + j + 1; the last row nothing
    assert batch.targets[0, 12:16].tolist() == [EOS, IGNORE, IGNORE, IGNORE]  # anchor 6 drafts EOS, then nothing
    weights = batch.weights[0, :4].tolist()
    assert weights == pytest.approx([1.0, math.exp(-0.5), math.exp(-1.0), 0.0])
    # the teacher of a drafted token is the clean row that predicts it from the exact prefix
    assert batch.teacher_rows[0, :3].tolist() == [3, 4, 5]


def test_a_block_sees_the_exact_tokens_before_its_anchor_and_itself_only():
    batch = _batch()
    length = batch.clean.shape[1]
    mask = batch.noisy_mask[0, 0]
    for row in range(batch.noisy.shape[1]):
        anchor = int(batch.noisy_positions[0, row]) - row % 4
        assert mask[row, :length].tolist() == [k < anchor for k in range(length)]
        own_block = [row // 4 == other // 4 for other in range(batch.noisy.shape[1])]
        assert mask[row, length:].tolist() == own_block


def test_an_unfinished_reply_drafts_nothing_past_its_end_and_anchors_are_capped():
    unfinished = dict(RECORD, finished=False)
    batch = _batch([unfinished], anchors=2)
    assert batch.noisy.shape[1] == 8  # two anchors of 4 rows
    for anchor_row in (0, 4):
        anchor = int(batch.noisy_positions[0, anchor_row])
        for j in range(3):
            target = int(batch.targets[0, anchor_row + j])
            assert target == IGNORE if anchor + j + 1 >= 7 else target == (RECORD["prompt_ids"] + RECORD["reply_ids"])[anchor + j + 1]


def test_the_loss_trains_the_adapter_only(make_tiny_bd):
    loaded = make_tiny_bd(seed=3)
    model = loaded.model
    records = [{"prompt_ids": [5, 6, 7, 8], "reply_ids": [20, 21, 22, 23, 24], "finished": True}]
    batch = make_batch(records, 4, 3, loaded.config.mask_token_id, loaded.config.eos_token_ids[0],
                       torch.Generator().manual_seed(1))
    for name, param in model.named_parameters():
        param.requires_grad_("lora" in name or name == "mask_embedding")
    loss, figures = loss_on(model, batch, distill_weight=0.5)
    loss.backward()
    assert torch.isfinite(loss) and figures["rows"] == int((batch.targets != IGNORE).sum()) > 0
    assert model.layers[0].qkv.lora.up.grad is not None and model.mask_embedding.grad is not None
    assert model.layers[0].qkv.weight.grad is None
    model.requires_grad_(False)
