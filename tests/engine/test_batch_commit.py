"""choose_commits: one batched selection for a step gives what each request's policy picks alone."""

import random

import torch

from dllm_engine.decoding import FactorPolicy, FixedStepsPolicy, ThresholdPolicy
from dllm_engine.decoding.batch_commit import Choice, choose_commits


def alone(choice: Choice) -> list[bool]:
    return choice.policy.select(choice.confidence.clone(), choice.steps_left, choice.threshold,
                                at_least_one=choice.at_least_one).tolist()


def test_batched_threshold_choices_equal_each_policy_alone():
    rng = random.Random(7)
    choices = []
    for _ in range(40):
        policy = ThresholdPolicy(rng.choice([0.5, 0.9, 0.99]), rng.choice(["most_confident", "leftmost"]))
        confidence = torch.rand(rng.randint(1, 17), generator=torch.Generator().manual_seed(rng.randint(0, 999)))
        threshold = rng.choice([None, 0.3])  # a deadline override or the policy's own
        choices.append(Choice(policy, confidence, threshold, at_least_one=rng.random() < 0.5))
    assert choose_commits(choices) == [alone(c) for c in choices]


def test_ties_pick_the_first_most_confident_position_as_the_policy_does():
    choice = Choice(ThresholdPolicy(0.9), torch.tensor([0.2, 0.6, 0.6, 0.1]))
    assert choose_commits([choice]) == [[False, True, False, False]] == [alone(choice)]


def test_other_policies_and_empty_rows_mix_with_threshold_rows():
    choices = [
        Choice(FactorPolicy(1.0), torch.tensor([0.7, 0.9, 0.6])),
        Choice(ThresholdPolicy(0.9), torch.tensor([0.95, 0.2])),
        Choice(FixedStepsPolicy(4), torch.tensor([0.1, 0.9, 0.5, 0.7, 0.2, 0.3]), steps_left=3),
        Choice(ThresholdPolicy(0.9), torch.tensor([])),
        Choice(ThresholdPolicy(0.9, "leftmost"), torch.tensor([0.3, 0.95, 0.4])),
    ]
    chosen = choose_commits(choices)
    assert [c for i, c in enumerate(chosen) if i != 3] == [alone(c) for i, c in enumerate(choices) if i != 3]
    assert chosen[1] == [True, False] and chosen[3] == [] and chosen[4] == [True, True, False]


def test_no_choices():
    assert choose_commits([]) == []
