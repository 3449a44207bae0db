"""Export a language-model artifact to the Hugging Face format: a folder that
``transformers.GPT2LMHeadModel.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load.

``transformer_lm`` is GPT-2's shape (pre-norm blocks, learned positions, GELU feed-forward, tied
embeddings), so the export renames and reshapes tensors and writes nothing else: GPT-2 keeps the
query, key and value projections as one ``c_attn`` and stores its linear layers as ``Conv1D``
(``[in, out]``, the transpose of ``nn.Linear``). Our GELU is the exact one (``activation_function:
gelu``, not GPT-2's tanh approximation). The byte tokenizer is written as a ``tokenizers`` byte-level
BPE with no merges, each of the 256 bytes its own id, and a trained BPE as itself, so the exported
tokenizer gives our ids.

    python -m scaleforge.artifacts.hf ARTIFACT OUT_FOLDER

Refused, naming why: a model that is not a language model, an MoE feed-forward, a quantized model
(GPT-2 has no int8 layers; export the float model).
"""

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from scaleforge.artifacts.store import load_artifact
from scaleforge.config.models import capabilities_of
from scaleforge.text.tokenizer import byte_chars, tokenizer_from_json


def export_hf(artifact: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write ``config.json``, ``model.safetensors`` and the tokenizer's files for ``artifact`` into ``out``
    (replaced as a whole: written beside it, then moved into place).

    Raises:
        ValueError: the artifact is not a dense float ``transformer_lm``.
    """
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    loaded = load_artifact(artifact)
    manifest, model = loaded.manifest, loaded.model
    spec = manifest["model"]
    if not capabilities_of(spec["name"]).language_model or spec.get("moe") or manifest.get("architecture"):
        raise ValueError(
            f"{artifact}: only a dense, float transformer_lm exports to GPT-2's format (this is a "
            f"{spec['name']}{' with MoE layers' if spec.get('moe') else ''}"
            f"{', compressed: ' + str(manifest['architecture']) if manifest.get('architecture') else ''})"
        )
    config = GPT2Config(
        vocab_size=manifest["num_classes"],
        n_positions=spec["context"],
        n_embd=spec["d_model"],
        n_layer=spec["num_layers"],
        n_head=spec["num_heads"],
        n_inner=spec["ff_dim"],
        activation_function="gelu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=spec["tie_embeddings"],
        bos_token_id=None,
        eos_token_id=None,
    )
    hf = GPT2LMHeadModel(config).eval()
    missing, unexpected = hf.load_state_dict(gpt2_state(model), strict=False)
    if unexpected or [k for k in missing if not k.endswith("attn.bias") and k != "lm_head.weight"]:
        raise ValueError(f"GPT-2 export: names that did not map: {unexpected or missing}")
    hf.tie_weights()
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        hf.save_pretrained(staging, safe_serialization=True)
        PreTrainedTokenizerFast(tokenizer_object=_hf_tokenizer(manifest)).save_pretrained(staging)
        (staging / "scaleforge.json").write_text(
            json.dumps({"artifact": str(loaded.path), "tokenizer": manifest.get("tokenizer")}, indent=2)
            + "\n"
        )
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def gpt2_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Our ``TransformerLM``'s tensors under GPT-2's names and layouts."""
    state = {
        "transformer.wte.weight": model.embed.weight,
        "transformer.wpe.weight": model.position[0],
        "transformer.ln_f.weight": model.norm.weight,
        "transformer.ln_f.bias": model.norm.bias,
    }
    if model.head is not None:
        state["lm_head.weight"] = model.head.weight
    for i, layer in model.layers.items():
        block, attention = f"transformer.h.{i}", layer.attention
        projections = (attention.query, attention.key, attention.value)
        state |= {
            f"{block}.ln_1.weight": layer.norm1.weight,
            f"{block}.ln_1.bias": layer.norm1.bias,
            f"{block}.ln_2.weight": layer.norm2.weight,
            f"{block}.ln_2.bias": layer.norm2.bias,
            f"{block}.attn.c_attn.weight": torch.cat([p.weight.T for p in projections], dim=1),
            f"{block}.attn.c_attn.bias": torch.cat([p.bias for p in projections]),
            f"{block}.attn.c_proj.weight": attention.out.weight.T,
            f"{block}.attn.c_proj.bias": attention.out.bias,
            f"{block}.mlp.c_fc.weight": layer.ff_in.weight.T,
            f"{block}.mlp.c_fc.bias": layer.ff_in.bias,
            f"{block}.mlp.c_proj.weight": layer.ff_out.weight.T,
            f"{block}.mlp.c_proj.bias": layer.ff_out.bias,
        }
    return {name: tensor.detach().contiguous().clone() for name, tensor in state.items()}


def _hf_tokenizer(manifest: dict):
    """The artifact's tokenizer as a ``tokenizers.Tokenizer`` whose ids are ours: a BPE's own, or the
    byte tokens as a byte-level BPE without merges."""
    recorded = manifest.get("tokenizer") or {"type": "bytes"}
    return tokenizer_from_json(recorded).tokenizer if recorded["type"] == "bpe" else byte_tokenizer()


def byte_tokenizer():
    """Our byte tokens as a ``tokenizers`` byte-level BPE without merges: byte ``b`` is id ``b``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in enumerate(byte_chars())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", help="a transformer_lm artifact (folder or URI)")
    parser.add_argument("out", help="the folder to write")
    args = parser.parse_args(argv)
    print(f"exported to {export_hf(args.artifact, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
