"""select_commits: the Triton kernel (interpreted on CPU) against the
reference, and the reference against the rule itself."""

import pytest
import torch

from kernels import FORCE_BEST, FORCE_LEFTMOST, FORCE_NONE, select_commits
from kernels.commit_selection import reference

BOTH = ["reference", "triton"]


def awkward_batch(rows: int, block_len: int):
    """Random confidences and masks with one empty row, one all-masked row and one row whose
    masked confidences all lie below its threshold."""
    confidence = torch.rand(rows, block_len)
    masked = torch.rand(rows, block_len) < 0.5
    threshold = torch.rand(rows) * 0.5 + 0.5
    masked[0] = False
    masked[1] = True
    confidence[2] = torch.rand(block_len) * 0.4
    return confidence, masked, threshold


@pytest.mark.parametrize("poisoned_outputs", [True, False], indirect=True)
@pytest.mark.parametrize("rows,block_len", [(5, 13), (3, 1), (9, 33), (4, 32)])
def test_triton_matches_reference(poisoned_outputs, rows, block_len):
    confidence, masked, threshold = awkward_batch(max(rows, 3), block_len)
    assert torch.equal(
        select_commits(confidence, masked, threshold, backend="triton"),
        reference(confidence, masked, threshold),
    )


@pytest.mark.parametrize("backend", BOTH)
def test_commit_rule(backend):
    confidence = torch.tensor([
        [0.95, 0.20, 0.91, 0.50],  # two over the threshold, one of them already committed
        [0.10, 0.30, 0.20, 0.30],  # none over: only the best; tie -> lowest position
        [0.99, 0.99, 0.99, 0.99],  # nothing masked: nothing committed
        [0.40, 0.60, 0.60, 0.10],  # threshold 0: every masked position
    ])
    masked = torch.tensor([
        [False, True, True, True],
        [True, True, True, True],
        [False, False, False, False],
        [True, False, True, True],
    ])
    threshold = torch.tensor([0.9, 0.9, 0.5, 0.0])
    expected = torch.tensor([
        [False, False, True, False],
        [False, True, False, False],
        [False, False, False, False],
        [True, False, True, True],
    ])
    assert torch.equal(select_commits(confidence, masked, threshold, backend=backend), expected)


@pytest.mark.parametrize("poisoned_outputs", [True, False], indirect=True)
@pytest.mark.parametrize("rows,block_len", [(6, 13), (7, 1), (9, 33)])
def test_triton_matches_reference_with_force(poisoned_outputs, rows, block_len):
    confidence, masked, threshold = awkward_batch(rows, block_len)
    force = torch.arange(rows) % 3  # none, best, leftmost in turn
    assert torch.equal(
        select_commits(confidence, masked, threshold, force, backend="triton"),
        reference(confidence, masked, threshold, force),
    )


@pytest.mark.parametrize("backend", BOTH)
def test_force_picks_best_leftmost_or_none(backend):
    confidence = torch.tensor([[0.30, 0.20, 0.50, 0.95]] * 3)
    masked = torch.tensor([[False, True, True, True]] * 3)
    threshold = torch.full((3,), 0.9)
    force = torch.tensor([FORCE_BEST, FORCE_LEFTMOST, FORCE_NONE])
    expected = torch.tensor([
        [False, False, False, True],  # best (0.95) is also the only one over the threshold
        [False, True, False, True],  # plus the first masked position, however unsure
        [False, False, False, True],  # only what reaches the threshold
    ])
    assert torch.equal(select_commits(confidence, masked, threshold, force, backend=backend), expected)
    low = torch.full((3,), 0.99)  # nothing reaches it: best, leftmost, nothing
    assert select_commits(confidence, masked, low, force, backend=backend).nonzero().tolist() == [[0, 3], [1, 1]]


@pytest.mark.parametrize("backend", BOTH)
def test_threshold_above_one_commits_exactly_one_per_row(backend):
    confidence, masked, threshold = awkward_batch(6, 11)
    committed = select_commits(confidence, masked, torch.full((6,), 1.5), backend=backend)
    assert committed.sum(dim=1).tolist() == masked.any(dim=1).int().tolist()
    assert not (committed & ~masked).any()


def test_strided_inputs():
    wide = torch.rand(5, 30)
    confidence = wide[:, ::2]
    masked = (torch.rand(5, 30) < 0.6)[:, 1::2]
    threshold = torch.rand(5)
    assert torch.equal(
        select_commits(confidence, masked, threshold, backend="triton"),
        reference(confidence.contiguous(), masked.contiguous(), threshold),
    )


@pytest.mark.parametrize("backend", BOTH)
def test_empty_batch(backend):
    committed = select_commits(torch.rand(0, 8), torch.zeros(0, 8, dtype=torch.bool), torch.rand(0), backend=backend)
    assert committed.shape == (0, 8)


@pytest.mark.parametrize(
    "confidence,masked,threshold,message",
    [
        (torch.rand(4), torch.zeros(4, dtype=torch.bool), torch.rand(1), "confidence must be"),
        (torch.rand(2, 4), torch.zeros(2, 5, dtype=torch.bool), torch.rand(2), "masked shape"),
        (torch.rand(2, 4), torch.zeros(2, 4), torch.rand(2), "masked must be torch.bool"),
        (torch.rand(2, 4), torch.zeros(2, 4, dtype=torch.bool), torch.rand(3), "threshold must be"),
    ],
)
def test_bad_inputs_name_the_problem(confidence, masked, threshold, message):
    with pytest.raises(ValueError, match=message):
        select_commits(confidence, masked, threshold)


@pytest.mark.parametrize("force,message", [
    (torch.ones(3, dtype=torch.long), r"force must be \[R\] = \[2\]"),
    (torch.ones(2), "force must be integer"),
])
def test_bad_force_names_the_problem(force, message):
    with pytest.raises(ValueError, match=message):
        select_commits(torch.rand(2, 4), torch.ones(2, 4, dtype=torch.bool), torch.rand(2), force)
