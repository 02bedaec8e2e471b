"""The embedded model: a tiny Llama built offline, so everything runs on a laptop CPU.

Weights are seeded, the tokenizer is a byte-level BPE trained on text that every
CPython ships (``pydoc_data/topics.py``: the language reference in English prose),
and the result is a plain Hugging Face directory that vLLM loads like any other.
The build is cached: a finished directory carries a stamp and is reused at once.
"""

from __future__ import annotations

import json
import shutil
import sysconfig
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from observe import settings

STAMP_FILE = "tailguard-model.json"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True, slots=True)
class TinyLlamaSpec:
    """Shape of the embedded model; bump `version` whenever any field changes."""

    version: int = 1
    seed: int = 1234
    vocab_size: int = 8192
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")


def default_model_dir(spec: TinyLlamaSpec = TinyLlamaSpec()) -> Path:
    """`$TAILGUARD_HOME/models/tiny-llama-v{N}`, `~/.cache/tailguard` by default."""
    home = settings.text(settings.TAILGUARD_HOME) or Path.home() / ".cache" / "tailguard"
    return Path(home) / "models" / f"tiny-llama-v{spec.version}"


def is_built(path: Path, spec: TinyLlamaSpec = TinyLlamaSpec()) -> bool:
    stamp = Path(path) / STAMP_FILE
    return stamp.is_file() and json.loads(stamp.read_text()) == asdict(spec)


def ensure_model(path: Path | None = None, spec: TinyLlamaSpec = TinyLlamaSpec()) -> Path:
    """Return a ready model directory, building it first if it is missing or stale."""
    path = Path(path) if path else default_model_dir(spec)
    if is_built(path, spec):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=path.parent))
    try:
        _build(staging, spec)
        (staging / STAMP_FILE).write_text(json.dumps(asdict(spec), indent=1))
        if path.exists():
            shutil.rmtree(path)
        staging.rename(path)  # atomic: a reader never sees a half-built model
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def corpus_path() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py"


def _build(out: Path, spec: TinyLlamaSpec) -> None:
    tokenizer = _train_tokenizer(spec)
    tokenizer.save_pretrained(out)
    _save_weights(out, spec, tokenizer)


def _train_tokenizer(spec: TinyLlamaSpec):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = corpus_path().read_text(encoding="utf-8")
    raw.train_from_iterator(text.splitlines(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=spec.max_position_embeddings,
    )


def _save_weights(out: Path, spec: TinyLlamaSpec, tokenizer) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
