"""configs/train_lm_tiny.yaml's model under every layout (dp, ep, tp, pp GPipe and 1F1B, fsdp; dp x tp,
fsdp x tp, dp x pp) on gloo processes, through the strategies Ray Train's workers use, trains exactly
what one process trains on the same standard-library bytes, gradient clipping included, with its
activations kept or recomputed (``parallel.activation_checkpointing``), and a step accumulated over
4 batches equals one step of a 4x batch; tp, pp and fsdp at degree 2 each hold at most 0.55x of one
process's model and optimiser state."""

import itertools

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import REPO
from gloo_ranks import run_ranks

from scaleforge.config import TrainJobConfig, load_config
from scaleforge.distributed import ParallelDims
from scaleforge.distributed.batches import ReplicatedBatches
from scaleforge.distributed.memory import memory_held
from scaleforge.distributed.strategy import Batch, accumulate, cross_entropy, parallelize
from scaleforge.models import MoESpec, TransformerLMSpec, build_model, count_parameters
from scaleforge.models.compiled import compile_model
from scaleforge.models.moe import auxiliary_loss
from scaleforge.models.plans import TRANSFORMER_LM
from scaleforge.models.recompute import set_activation_checkpointing
from scaleforge.text.corpus import load_corpus
from scaleforge.text.dataset import windows
from scaleforge.text.tokenizer import ByteTokenizer

TINY = load_config(TrainJobConfig, REPO / "configs" / "train_lm_tiny.yaml")
SEQ, BATCH, STEPS, LR, CLIP = TINY.data.seq_len, 8, 5, 3e-3, 0.5
DENSE = TINY.model  # configs/train_lm_tiny.yaml's model
MOE = DENSE.model_copy(
    update={"moe": MoESpec(num_experts=4, expert_hidden=32, top_k=2, capacity_factor=100.0)}
)
LARGE = TransformerLMSpec(
    context=SEQ, d_model=256, num_heads=8, num_layers=8, ff_dim=1024, dropout=0.0
)  # 6.4M parameters
TWO_RANKS = {
    "dp=2": (DENSE, dict(dp=2)),
    "ep=2": (MOE, dict(dp=2, ep=2)),
    "tp=2": (DENSE, dict(tp=2)),
    "pp=2 gpipe": (DENSE, dict(pp=2, pp_schedule="gpipe")),
    "pp=2 1f1b": (DENSE, dict(pp=2, pp_schedule="1f1b")),
    "fsdp=2": (DENSE, dict(fsdp=2)),
}
FOUR_RANKS = {
    "dp=2 x tp=2": (DENSE, dict(dp=2, tp=2)),
    "fsdp=2 x tp=2": (DENSE, dict(fsdp=2, tp=2)),
    "dp=2 x pp=2": (DENSE, dict(dp=2, pp=2)),
}
MEMORY_LAYOUTS = {"tp=2": dict(tp=2), "pp=2": dict(pp=2), "fsdp=2": dict(fsdp=2)}
RECOMPUTE = ("full", "selective")
SELECTIVE = {"tp=2", "pp=2 1f1b", "fsdp=2"}
"""``full`` recomputation runs on every layout; ``selective`` (the same checkpoint, a policy per op)
on each kind of split."""
BF16 = {"dp=2", "ep=2", "tp=2", "pp=2 1f1b", "fsdp=2"}
"""Mixed precision on each strategy's own code path (the 2-D meshes add no precision handling)."""
ACCUMULATE = 4
ACCUMULATED = {"dp=2", "tp=2", "pp=2 1f1b", "fsdp=2", "dp=2 x pp=2"}
"""The dense layouts: the MoE balancing loss is a function of each batch's routing, so 4 batches'
mean is not a 4x batch's."""
COMPILED = {"dp=2", "fsdp=2"}
"""``run.compile`` (inductor's C++ build takes seconds per graph); every layout's tokens/s with and
without: ``bench/lm_levers.py``."""


def _tokens():
    """Real text: the first 64 kB of the standard-library corpus's training split, as byte tokens."""
    x, y = windows(ByteTokenizer().encode(load_corpus().read("train")[:65536]), SEQ)
    return torch.from_numpy(x).long(), torch.from_numpy(y).long()


def _model(spec, recompute="none", compiled=False):
    torch.manual_seed(0)
    model = build_model(spec, SEQ, ByteTokenizer.vocab_size)
    set_activation_checkpointing(model, recompute)
    if compiled:
        compile_model(model)
    return model


def _loss(module):
    return lambda logits, batch: cross_entropy(logits, batch) + auxiliary_loss(module)


def _single_process_losses(spec, batch=BATCH):
    model, (x, y) = _model(spec), _tokens()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for bx, by in itertools.islice(ReplicatedBatches(x, y, batch, 0, 1, seed=0).epoch(0), STEPS):
        optimizer.zero_grad()
        loss = _loss(model)(model(bx), Batch(bx, by))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item()
        optimizer.step()
        losses.append((loss.item(), norm))
    return losses


def _split(spec, layout, recompute="none", bf16=False, compiled=False):
    dims = ParallelDims.resolve(dist.get_world_size(), **{"dp": 1, "microbatches": 4, **layout})
    split = parallelize(_model(spec, recompute, compiled), dims, TRANSFORMER_LM, torch.device("cpu"), bf16)
    return split, torch.optim.AdamW(split.module.parameters(), lr=LR)


def _train(split, optimizer, batches):
    """Steps of the split model; the global mean loss of each step (every rank gets it)."""
    losses = []
    for bx, by in batches:
        optimizer.zero_grad()
        loss, _ = split.train_step(Batch(bx, by), _loss(split.module))
        norm = split.clip_gradients(CLIP)
        optimizer.step()
        mine = torch.tensor([loss.item(), 1.0] if split.reports_metrics else [0.0, 0.0], dtype=torch.float64)
        dist.all_reduce(mine)
        losses.append(((mine[0] / mine[1]).item(), norm))
    return losses


def _numerics(spec, layout, recompute="none", bf16=False, compiled=False):
    split, optimizer = _split(spec, layout, recompute, bf16, compiled)
    x, y = _tokens()
    batches = ReplicatedBatches(x, y, BATCH // split.data_world, split.data_rank, split.data_world, seed=0)
    return _train(split, optimizer, itertools.islice(batches.epoch(0), STEPS))


def _accumulated(spec, layout):
    """STEPS steps of a global batch of ACCUMULATE x BATCH rows, each rank accumulating ACCUMULATE
    batches of its slices as the trainer does (``optim.accumulate_steps``)."""
    split, optimizer = _split(spec, layout)
    x, y = _tokens()
    slices = split.data_world * ACCUMULATE
    steps = ReplicatedBatches(
        x, y, ACCUMULATE * BATCH // slices, split.data_rank, split.data_world, 0, slices
    )
    losses = []
    for rows in itertools.islice(steps.rows(0), STEPS):
        optimizer.zero_grad()
        batches = [Batch(x[r], y[r]) for r in rows]
        mine = torch.zeros(2, dtype=torch.float64)
        for loss, _ in accumulate(split, batches, _loss(split.module), slices):
            if loss is not None:
                mine += torch.tensor([loss.item(), 1.0], dtype=torch.float64)
        norm = split.clip_gradients(CLIP)
        optimizer.step()
        dist.all_reduce(mine)
        losses.append(((mine[0] / mine[1]).item(), norm))
    return losses


def _memory(layout):
    split, optimizer = _split(LARGE, layout)
    x, y = _tokens()
    _train(split, optimizer, [(x[:4], y[:4])])  # gradients and optimiser state now exist
    return sum(vars(split.memory(optimizer)).values())


def _work(layouts, memory_layouts):
    return {
        "losses": {name: _numerics(spec, layout) for name, (spec, layout) in layouts.items()},
        "recomputed": {
            f"{name} {mode}": _numerics(spec, layout, mode)
            for name, (spec, layout) in layouts.items()
            for mode in RECOMPUTE
            if mode == "full" or name in SELECTIVE
        },
        "bf16": {
            name: _numerics(spec, layout, bf16=True)
            for name, (spec, layout) in layouts.items()
            if name in BF16
        },
        "compiled": {
            name: _numerics(spec, layout, "full", compiled=True)
            for name, (spec, layout) in layouts.items()
            if name in COMPILED
        },
        "accumulated": {
            name: _accumulated(spec, layout)
            for name, (spec, layout) in layouts.items()
            if name in ACCUMULATED
        },
        "memory": {name: _memory(layout) for name, layout in memory_layouts.items()},
    }


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return run_ranks(tmp_path_factory.mktemp("lm2"), 2, _work, TWO_RANKS, MEMORY_LAYOUTS)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    return run_ranks(tmp_path_factory.mktemp("lm4"), 4, _work, FOUR_RANKS, {})


@pytest.fixture(scope="module")
def reference():
    return {
        "dense": _single_process_losses(DENSE),
        "moe": _single_process_losses(MOE),
        "dense x4": _single_process_losses(DENSE, ACCUMULATE * BATCH),
    }


@pytest.mark.parametrize("name", [*TWO_RANKS, *FOUR_RANKS])
def test_loss_at_each_of_five_steps_equals_one_process(name, two_ranks, four_ranks, reference):
    """Every step clips the gradient to norm 0.5, which is below its norm at every step: the norm of
    the whole model's gradient, over shards, stages and experts, is checked too."""
    ranks, (spec, _) = (two_ranks if name in TWO_RANKS else four_ranks), {**TWO_RANKS, **FOUR_RANKS}[name]
    expected_losses, expected_norms = zip(*reference["moe" if spec.moe else "dense"])
    assert (
        expected_losses[-1] < expected_losses[0] - 0.1
    )  # the steps learn: the comparison is not of constants
    assert min(expected_norms) > CLIP  # clipping acted at every step
    for result in ranks:
        losses, norms = zip(*result["losses"][name])
        print(
            f"{name}: losses {', '.join(f'{v:.4f}' for v in losses)}; max |loss - one process| = "
            f"{max(abs(a - b) for a, b in zip(losses, expected_losses)):.1e}; gradient norms "
            f"{', '.join(f'{v:.3f}' for v in norms)}"
        )
        assert losses == pytest.approx(expected_losses, abs=1e-4), name
        assert norms == pytest.approx(expected_norms, rel=1e-4), name


@pytest.mark.parametrize(
    "name, mode",
    [(name, "full") for name in [*TWO_RANKS, *FOUR_RANKS]]
    + [(name, "selective") for name in sorted(SELECTIVE)],
)
def test_recomputed_activations_give_the_same_loss_at_each_step(name, mode, two_ranks, four_ranks):
    """``parallel.activation_checkpointing``: the same layout with its layers' activations recomputed in
    backward (``full``: every op, on every layout; ``selective``: all but matmuls and attention, on
    each kind of split) takes the same steps as with them kept."""
    for result in two_ranks if name in TWO_RANKS else four_ranks:
        kept, recomputed = result["losses"][name], result["recomputed"][f"{name} {mode}"]
        assert [loss for loss, _ in recomputed] == pytest.approx([loss for loss, _ in kept], abs=1e-5), name
        assert [norm for _, norm in recomputed] == pytest.approx([norm for _, norm in kept], rel=1e-5), name


@pytest.mark.parametrize("name", sorted(BF16))
def test_bf16_tracks_fp32_at_each_step(name, two_ranks):
    """``optim.precision: bf16`` (autocast; FSDP gathers in bf16 and reduces in fp32): the same five
    steps as fp32 to bf16's precision, and the loss falls as it does. (Over a whole run of
    ``configs/train_lm_tiny.yaml``: ``bench/lm_levers.py``.)"""
    for result in two_ranks:
        fp32, bf16 = ([loss for loss, _ in result[kind][name]] for kind in ("losses", "bf16"))
        print(f"{name}: bf16 losses {', '.join(f'{v:.4f}' for v in bf16)}")
        print(f"{name}: fp32 losses {', '.join(f'{v:.4f}' for v in fp32)}")
        assert bf16 == pytest.approx(fp32, abs=0.02), name
        assert bf16[-1] < bf16[0] - 0.1, name


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_compiled_layers_take_the_same_steps(name, two_ranks):
    """``run.compile``: each layer's computation compiled by inductor, recomputed in backward
    (``full``), under DDP and FSDP2's hooks: the same steps as eager with activations kept."""
    for result in two_ranks:
        eager, compiled = result["losses"][name], result["compiled"][name]
        assert [loss for loss, _ in compiled] == pytest.approx([loss for loss, _ in eager], abs=1e-5), name
        assert [norm for _, norm in compiled] == pytest.approx([norm for _, norm in eager], rel=1e-5), name


@pytest.mark.parametrize("name", sorted(ACCUMULATED))
def test_four_accumulated_batches_make_the_step_of_a_four_times_larger_one(
    name, two_ranks, four_ranks, reference
):
    """``optim.accumulate_steps: 4``: each rank runs 4 batches and all-reduces once; the step equals one
    process's step on the 4x batch, gradient norm included."""
    expected_losses, expected_norms = zip(*reference["dense x4"])
    for result in two_ranks if name in TWO_RANKS else four_ranks:
        losses, norms = zip(*result["accumulated"][name])
        gap = np.abs(np.subtract(losses, expected_losses)).max()
        print(f"{name}: max |loss - one process at 4x batch| = {gap:.1e}")
        assert losses == pytest.approx(expected_losses, abs=1e-5), name
        assert norms == pytest.approx(expected_norms, rel=1e-5), name


def test_tp_pp_fsdp_each_hold_at_most_055_of_one_process(two_ranks):
    model = _model(LARGE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    x, y = _tokens()
    cross_entropy(model(x[:4]), Batch(x[:4], y[:4])).backward()
    optimizer.step()
    one_process = memory_held(model, optimizer).total
    for name in MEMORY_LAYOUTS:
        for rank, result in enumerate(two_ranks):
            held = result["memory"][name]
            print(
                f"{name} rank {rank}: {held / 2**20:.1f} MiB = {held / one_process:.3f}x one process "
                f"({one_process / 2**20:.1f} MiB, {count_parameters(model):,} parameters)"
            )
            assert held <= 0.55 * one_process, f"{name} rank {rank}: {held / one_process:.3f}x"
