"""confidence_head: the Triton kernel (interpreted on CPU) against the torch reference and
against a plain full softmax."""

import pytest
import torch

from kernels import confidence_head
from kernels.head_confidence import reference
from kernels.triton_ops.head_confidence import run_confidence_head


def full_softmax_oracle(hidden, weight, temperature):
    probs = torch.softmax(hidden.double() @ weight.double().T / temperature, dim=1)
    entropy = -(probs * torch.log(probs.clamp_min(1e-300))).sum(dim=1)
    return probs.argmax(dim=1), probs.max(dim=1).values, entropy


# (rows, vocab, hidden): nothing a multiple of the tiles (16 rows, 128 vocab, 64 hidden),
# one row, more rows than one row tile, a vocabulary shorter than one tile.
SHAPES = [(5, 300, 40), (1, 1000, 100), (70, 257, 33), (17, 37, 64)]


@pytest.mark.parametrize("rows,vocab,hidden_size", SHAPES)
def test_triton_matches_reference_and_full_softmax(poisoned_outputs, rows, vocab, hidden_size):
    hidden = torch.randn(rows, hidden_size) * 2
    weight = torch.randn(vocab, hidden_size)
    token, prob, entropy = confidence_head(hidden, weight, 0.8, backend="triton")
    ref_token, ref_prob, ref_entropy = reference(hidden, weight, 0.8)
    assert torch.equal(token, ref_token)
    torch.testing.assert_close(prob, ref_prob, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(entropy, ref_entropy, rtol=1e-4, atol=1e-5)
    oracle_token, oracle_prob, oracle_entropy = full_softmax_oracle(hidden, weight, 0.8)
    assert torch.equal(ref_token, oracle_token)
    torch.testing.assert_close(ref_prob.double(), oracle_prob, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ref_entropy.double(), oracle_entropy, rtol=1e-4, atol=1e-5)
    assert token.dtype == torch.int64 and prob.dtype == entropy.dtype == torch.float32


@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_vocabulary_split_count_does_not_change_results(poisoned_outputs, num_splits):
    hidden, weight = torch.randn(6, 48), torch.randn(1000, 48)
    token, prob, entropy = run_confidence_head(hidden, weight, 1.0, num_splits=num_splits)
    ref_token, ref_prob, ref_entropy = reference(hidden, weight)
    assert torch.equal(token, ref_token)
    torch.testing.assert_close(prob, ref_prob)
    torch.testing.assert_close(entropy, ref_entropy, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_ties_go_to_the_lowest_token_id(backend):
    # Small integers make every logit exact, so the duplicated rows tie exactly; the copies
    # sit in other tiles, other vocabulary slices and other reference chunks.
    hidden = torch.randint(-2, 3, (4, 20)).float()
    weight = torch.randint(-2, 3, (600, 20)).float()
    winners = torch.tensor([3, 150, 299, 7])
    for row, winner in enumerate(winners):
        weight[winner] = hidden[row] * 3  # beats any row drawn from [-2, 2]
        weight[winner + 290] = weight[winner]
    token, _, _ = run_confidence_head(hidden, weight, 1.0, num_splits=4) if backend == "triton" \
        else reference(hidden, weight, vocab_chunk=128)
    assert torch.equal(token, winners)
    assert torch.equal(torch.argmax(hidden @ weight.T, dim=1), winners)  # torch agrees


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_kernel_keeps_fp32_logits(poisoned_outputs, dtype):
    hidden = torch.randn(9, 72).to(dtype)
    weight = torch.randn(333, 72).to(dtype)
    token, prob, entropy = confidence_head(hidden, weight, backend="triton")
    ref_token, ref_prob, ref_entropy = reference(hidden.float(), weight.float())
    assert torch.equal(token, ref_token)
    torch.testing.assert_close(prob, ref_prob, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(entropy, ref_entropy, rtol=1e-4, atol=1e-5)


def test_bf16_reference_is_close_to_fp32():
    hidden, weight = torch.randn(9, 72), torch.randn(333, 72) * 0.1
    _, prob, entropy = reference(hidden.bfloat16(), weight.bfloat16())
    _, ref_prob, ref_entropy = reference(hidden, weight)
    torch.testing.assert_close(prob, ref_prob, rtol=0.05, atol=0.01)
    torch.testing.assert_close(entropy, ref_entropy, rtol=0.05, atol=0.05)


def test_strided_hidden_states(poisoned_outputs):
    wide = torch.randn(7, 80)
    hidden = wide[:, ::2]  # stride 2 along the features
    weight = torch.randn(200, 40)
    token, prob, _ = confidence_head(hidden, weight, backend="triton")
    ref_token, ref_prob, _ = reference(hidden.contiguous(), weight)
    assert torch.equal(token, ref_token)
    torch.testing.assert_close(prob, ref_prob)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_no_rows_gives_empty_outputs(backend):
    token, prob, entropy = confidence_head(torch.randn(0, 8), torch.randn(50, 8), backend=backend)
    assert token.shape == prob.shape == entropy.shape == (0,)


def test_sharper_temperature_raises_confidence():
    hidden, weight = torch.randn(4, 16), torch.randn(100, 16)
    _, cool_prob, cool_entropy = confidence_head(hidden, weight, 0.5)
    _, warm_prob, warm_entropy = confidence_head(hidden, weight, 2.0)
    assert (cool_prob > warm_prob).all() and (cool_entropy < warm_entropy).all()


@pytest.mark.parametrize(
    "hidden,weight,temperature,message",
    [
        (torch.randn(3), torch.randn(5, 3), 1.0, "hidden must be"),
        (torch.randn(2, 3), torch.randn(5, 4), 1.0, "hidden size differs"),
        (torch.randn(2, 3), torch.randn(5, 3).double(), 1.0, "dtype differs"),
        (torch.randn(2, 3), torch.randn(0, 3), 1.0, "empty vocabulary"),
        (torch.randn(2, 3), torch.randn(5, 3), 0.0, "temperature must be > 0"),
    ],
)
def test_bad_inputs_name_the_problem(hidden, weight, temperature, message):
    with pytest.raises(ValueError, match=message):
        confidence_head(hidden, weight, temperature)


@pytest.mark.parametrize("vocab_chunk", [1, 100, 999])
def test_reference_chunking_does_not_change_results(vocab_chunk):
    hidden, weight = torch.randn(5, 24) * 2, torch.randn(1000, 24)
    token, prob, entropy = reference(hidden, weight, 0.9, vocab_chunk=vocab_chunk)
    oracle_token, oracle_prob, oracle_entropy = full_softmax_oracle(hidden, weight, 0.9)
    assert torch.equal(token, oracle_token)
    torch.testing.assert_close(prob.double(), oracle_prob, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(entropy.double(), oracle_entropy, rtol=1e-4, atol=1e-5)
