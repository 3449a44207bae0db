"""The engine: speculative greedy decoding gives the target's own tokens, the speculative sampler the
target's distribution, and continuous batching lets a short request finish before a long one."""

import asyncio

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from scaleforge.config.models import TransformerLMSpec
from scaleforge.generate.drafters import LookupDrafter, ModelDrafter
from scaleforge.generate.engine import Engine, EngineFailed, EngineFull
from scaleforge.generate.sampling import Sampling, accept
from scaleforge.models.transformer_lm import TransformerLM


def lm(seed: int, width: int, vocab: int = 256, context: int = 24) -> TransformerLM:
    torch.manual_seed(seed)
    spec = TransformerLMSpec(
        context=context, d_model=width, num_heads=4, num_layers=2, ff_dim=2 * width, dropout=0.0
    )
    return TransformerLM(spec, input_dim=context, num_classes=vocab).eval()


async def generate(engine: Engine, prompts, max_tokens: int, draft_tokens: int = 0, temperature: float = 0.0):
    async def one(prompt, seed):
        sequence = engine.submit(prompt, max_tokens, Sampling(temperature, seed=seed), draft_tokens)
        return [t async for run in engine.stream(sequence) for t in run]

    return await asyncio.gather(*(one(p, i) for i, p in enumerate(prompts)))


def test_speculative_greedy_is_the_target_alone_past_the_context():
    """Drafted by a small model and by prompt lookup, 60 new tokens through a 24-token context (the
    window slides twice): the same tokens as the target decoding alone."""
    target, student = lm(0, 32), lm(1, 16)
    prompts = [list(np.random.default_rng(i).integers(0, 256, n)) for i, n in enumerate((5, 12, 24, 1))]
    alone = asyncio.run(generate(Engine(target, None, max_running=4, max_waiting=8), prompts, 60))
    assert all(len(tokens) == 60 for tokens in alone)
    for drafter in (ModelDrafter(student, slots=2), LookupDrafter()):
        engine = Engine(target, drafter, max_running=2, max_waiting=8)
        assert asyncio.run(generate(engine, prompts, 60, draft_tokens=4)) == alone, drafter.name
        assert engine.stats.drafted > 0


def test_the_acceptance_rule_samples_the_target_distribution():
    """A token drafted from q, then the rule: the first token emitted follows p (chi-square)."""
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    q = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])
    sampling = Sampling(temperature=1.0, seed=0)
    counts = np.zeros(5)
    for _ in range(20_000):
        drafted = int(torch.multinomial(q, 1, generator=sampling.generator))
        counts[accept(sampling, [drafted], q[None], torch.stack([p, p]))[0]] += 1
    assert chisquare(counts, 20_000 * p.numpy()).pvalue > 0.001


def test_speculative_sampling_matches_the_target_through_the_engine():
    """Sampled with temperature 1 over a 6-token vocabulary: the second new token's distribution with a
    drafter equals the target's alone (chi-square over 1,500 seeds, both sides)."""
    target, student = lm(0, 32, vocab=6, context=16), lm(1, 16, vocab=6, context=16)
    prompts = [[1, 2, 3]] * 1500
    counts = []
    for drafter, k in ((None, 0), (ModelDrafter(student, slots=16), 3)):
        engine = Engine(target, drafter, max_running=16, max_waiting=1500)
        outputs = asyncio.run(generate(engine, prompts, 2, draft_tokens=k, temperature=1.0))
        counts.append(np.bincount([tokens[1] for tokens in outputs], minlength=6))
    expected = counts[0] / counts[0].sum() * counts[1].sum()
    assert chisquare(counts[1] + 0.5, expected + 0.5).pvalue > 0.001, counts


def test_a_short_request_finishes_before_a_long_one():
    engine = Engine(lm(0, 32), None, max_running=4, max_waiting=4)
    finished = []

    async def run():
        async def one(name, max_tokens):
            sequence = engine.submit([1, 2, 3], max_tokens, Sampling(0.0))
            async for _ in engine.stream(sequence):
                pass
            finished.append(name)

        await asyncio.gather(one("long", 200), one("short", 5))

    asyncio.run(run())
    assert finished == ["short", "long"]
    assert max(engine.stats.batch_sizes) == 2


def test_bounded_waiting_and_bad_prompts():
    async def run():
        engine = Engine(lm(0, 32), None, max_running=1, max_waiting=1)
        engine.submit([1], 500, Sampling(0.0))
        await asyncio.sleep(0.05)  # the first takes the slot, the second waits, the third is refused
        engine.submit([1], 5, Sampling(0.0))
        with pytest.raises(EngineFull, match="1 sequences running and 1 waiting"):
            engine.submit([1], 5, Sampling(0.0))
        with pytest.raises(ValueError, match="must be 1 to 24"):
            engine.submit(list(range(25)), 5, Sampling(0.0))
        engine.shutdown()

    asyncio.run(run())


def test_speculative_greedy_equals_the_target_over_50_held_out_prompts_of_256_tokens(tmp_path_factory):
    """Trained models (the drafter smaller), 50 prompts from the validation files, 256 new tokens each
    through a 64-token context (the window slides 7 times): the drafted text is the target's own,
    byte for byte, with the student drafting and with prompt lookup."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "serving"))
    from lm_env import trained_lms

    from scaleforge.artifacts.store import load_model
    from scaleforge.generate.prompts import held_out_prompts

    torch.set_num_threads(2)
    lms = trained_lms(tmp_path_factory)
    target, student = load_model(lms["target"]), load_model(lms["drafter"])
    prompts = [list(p) for p in held_out_prompts(50, 32)]
    alone = asyncio.run(generate(Engine(target, None, max_running=16, max_waiting=50), prompts, 256))
    for drafter in (ModelDrafter(student, slots=16), LookupDrafter()):
        engine = Engine(target, drafter, max_running=16, max_waiting=50)
        drafted = asyncio.run(generate(engine, prompts, 256, draft_tokens=4))
        assert [bytes(t) for t in drafted] == [bytes(t) for t in alone], drafter.name
        assert engine.stats.accepted > 0.3 * engine.stats.drafted, (drafter.name, engine.stats)


class _BrokenDrafter(LookupDrafter):
    """A drafter whose proposals fail, as a broken drafter model would."""

    def propose(self, slots, windows, ks, samplings):
        raise RuntimeError("the drafter broke")


def test_a_failed_iteration_ends_its_requests_with_the_error_and_the_engine_goes_on():
    engine = Engine(lm(0, 32), _BrokenDrafter(), max_running=2, max_waiting=4)

    async def run():
        broken = engine.submit([1, 2, 3], 20, Sampling(0.0), draft_tokens=4)
        with pytest.raises(EngineFailed, match="the drafter broke"):
            [t async for run in engine.stream(broken) for t in run]
        plain = engine.submit([1, 2, 3], 20, Sampling(0.0))  # no drafting: the same engine answers
        return [t async for run in engine.stream(plain) for t in run]

    assert len(asyncio.run(run())) == 20
