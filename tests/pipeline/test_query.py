"""The query stage's merge of the answers of many requests."""

import numpy as np
import torch

from scaleforge.pipeline.query import concat_rows
from scaleforge.routing import choose_experts


def test_answers_of_a_router_that_lost_an_expert_between_requests_merge_row_by_row():
    """The MoE router traces the experts it used: two columns at top_k=2, one while one of two experts
    is down (as when an expert timed out under load). The query stage merges both batches, padding
    the narrower one, and the first expert of every row survives."""
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 0.5]])
    both = choose_experts(logits[:2], 2, torch.tensor([True, True]))
    one_down = choose_experts(logits[2:], 2, torch.tensor([False, True]))
    assert one_down.experts.shape == (1, 1)
    experts = concat_rows([both.experts.numpy(), one_down.experts.numpy()])
    fallback = concat_rows([both.fallback.numpy(), one_down.fallback.numpy()])
    assert experts.tolist() == [[0, 1], [1, 0], [1, -1]]
    # Expert 1 was among the row's top 2: fewer experts, not a fallback; the padding is no fallback either.
    assert fallback.tolist() == [[False, False], [False, False], [False, False]]
    classes = concat_rows([np.array([3, 4]), np.array([5])])  # one-dimensional outputs: plain concatenation
    assert classes.tolist() == [3, 4, 5]
