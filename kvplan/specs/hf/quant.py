"""Weight formats from a checkpoint's quantization config (config.json `quantization_config`, or
ModelOpt's `hf_quant_config.json` beside it), resolved per weight matrix into the spec's
`weight_formats` (README, Weight formats). A method or field kvplan cannot model is a note, never a
silent bf16 count; a malformed config is a SpecError naming the file and field."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvplan.errors import SpecError
from kvplan.limits import MAX_BYTES, MAX_INDEX_FILE_BYTES
from kvplan.specs.io import load_json_text, read_text
from kvplan.specs.matrices import Matrix, weight_matrices
from kvplan.specs.models import ModelSpec


@dataclass(frozen=True)
class Group:
    fmt: str  # a weight format name (formats.weight_format)
    targets: tuple[str, ...] = ()  # module patterns; () = every Linear


@dataclass(frozen=True)
class Scheme:
    method: str
    groups: tuple[Group, ...]  # first group whose targets match wins
    ignore: tuple[str, ...] = ()  # module patterns kept at the model dtype
    keep: frozenset[str] = frozenset({"embedding"})  # components this method never quantizes
    only: frozenset[str] | None = None  # the only components it quantizes (gpt-oss MXFP4: experts)


_KEEP_HEAD = frozenset({"embedding", "lm_head"})


class _Field:
    """Typed reads of one quantization config's fields; errors name the file and field."""

    def __init__(self, where: str, cfg: dict) -> None:
        self.where, self.cfg = where, cfg

    def bad(self, key: str, msg: str) -> SpecError:
        return SpecError(f"{self.where}.{key}: {msg}")

    def int(self, key: str, default: int | None = None, *alts: str) -> int | None:
        for k in (key, *alts):
            value = self.cfg.get(k)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise self.bad(k, f"expected an integer, got {value!r}")
                return value
        return default

    def patterns(self, *keys: str) -> tuple[str, ...]:
        out: list[str] = []
        for key in keys:
            value = self.cfg.get(key)
            if value is None:
                continue
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise self.bad(key, "expected a list of module names")
            out += value
        return tuple(out)


def _int_format(bits: int, group: int | None, scale_bits: int, zero_bits: int) -> str:
    grouping = "ch" if not group or group < 0 else f"g{group}"
    return f"int{bits}-{grouping}-s{scale_bits}" + (f"-z{zero_bits}" if zero_bits else "")


def _fp8(f: _Field) -> Scheme:
    block = f.cfg.get("weight_block_size")
    if block is None:  # transformers FP8 (static): one fp32 weight_scale per tensor
        fmt = "fp8-t32"
    elif isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block):
        if block[0] != block[1]:
            raise f.bad("weight_block_size", f"{block}: only square blocks are modelled")
        fmt = f"fp8-b{block[0]}-s32"  # DeepSeek-V3 fine-grained fp8: one fp32 scale per block
    else:
        raise f.bad("weight_block_size", f"expected [rows, cols], got {block!r}")
    # vllm/model_executor/layers/quantization/fp8.py v0.11.0 Fp8Config.from_config: ignored_layers (AutoFP8,
    # llm-compressor exports), else modules_to_not_convert; transformers keeps the output embedding unquantized
    # (get_modules_to_not_convert)
    kept = f.patterns("ignored_layers") or f.patterns("modules_to_not_convert")
    return Scheme("fp8", (Group(fmt),), kept, _KEEP_HEAD)


def _awq_gptq(f: _Field, method: str) -> Scheme:
    bits = f.int("bits", None, "w_bit")
    # vllm/model_executor/layers/quantization/gptq.py v0.11.0 GPTQConfig.__init__
    if bits not in (2, 3, 4, 8):
        raise f.bad("bits", f"expected 2, 3, 4 or 8, got {bits!r}")
    # vllm/model_executor/layers/quantization/awq.py v0.11.0 AWQConfig.__init__: "only 4-bit weight quantization
    # is supported for AWQ" (awq_marlin.py takes AWQ's zero-point layout at 4 bits only: marlin_utils.py uint4)
    if method == "awq" and bits != 4:
        raise f.bad("bits", f"{bits}: vLLM serves AWQ checkpoints at 4 bits only and refuses this one; use a "
                    "4-bit AWQ (or a GPTQ) export")  # fmt: skip
    group = f.int("group_size", 128, "q_group_size")
    # gptq.py / awq.py v0.11.0 create_weights: `input_size_per_partition % group_size` (-1: one group a row)
    if group is not None and (group == 0 or group < -1):
        raise f.bad(
            "group_size", f"{group}: expected -1 (one group a row) or a positive group size; fix the config"
        )
    # AutoAWQ: fp16 scales + packed zeros per group; GPTQ stores packed qzeros even when sym
    # (its g_idx, one int32 per input channel, < 0.01 bits/weight, is not counted)
    zero = method == "gptq" or f.cfg.get("zero_point", True) is not False
    fmt = _int_format(bits, group, 16, bits if zero else 0)
    return Scheme(method, (Group(fmt),), f.patterns("modules_to_not_convert"), _KEEP_HEAD)


def _bnb(f: _Field) -> Scheme:
    skip = f.patterns("llm_int8_skip_modules")
    # transformers utils/quantization_config.py 4.57.0 BitsAndBytesConfig.__init__ raises for both, so no
    # checkpoint is saved so; kvplan cannot tell which width its weights are
    if f.cfg.get("load_in_4bit") and f.cfg.get("load_in_8bit"):
        raise f.bad("load_in_8bit", "true, and so is load_in_4bit: bitsandbytes quantizes to one of "
                    "them (transformers' BitsAndBytesConfig refuses both); keep the one the weights were "
                    "saved in")  # fmt: skip
    if f.cfg.get("load_in_4bit"):
        kind = str(f.cfg.get("bnb_4bit_quant_type", "fp4"))
        if kind not in ("nf4", "fp4"):
            raise f.bad("bnb_4bit_quant_type", f"expected nf4 or fp4, got {kind!r}")
        # bitsandbytes: fp32 absmax per 64 values; double quant: 8-bit absmax + an fp32 per 256 blocks
        dq = bool(f.cfg.get("bnb_4bit_use_double_quant"))
        fmt = f"{kind}-g64-s8-q16384" if dq else f"{kind}-g64-s32"
    elif f.cfg.get("load_in_8bit"):
        fmt = "int8-ch-s32"  # LLM.int8(): int8 weights + an fp32 scale (SCB) per output row
    else:
        raise f.bad("load_in_4bit", "neither load_in_4bit nor load_in_8bit is true")
    return Scheme("bitsandbytes", (Group(fmt),), skip, _KEEP_HEAD)


def _ct_format(f: _Field, name: str, w: Any, act_bits: int) -> str:
    g = _Field(f"{f.where}.config_groups.{name}.weights", w if isinstance(w, dict) else {})
    if not isinstance(w, dict):
        raise g.bad("", "expected an object")
    bits, kind = g.int("num_bits"), w.get("type", "int")
    strategy, group = w.get("strategy"), g.int("group_size")
    if kind == "float" and bits == 4:  # compressed-tensors nvfp4 (group 16, fp8 scales) / mxfp4 (32, e8m0)
        return {16: "nvfp4", 32: "mxfp4"}.get(group or 0) or _raise(g.bad("group_size", f"{group}"))
    if bits not in (2, 4, 8) or kind not in ("int", "float") or (kind == "float" and bits != 8):
        raise g.bad("num_bits", f"{kind} with {bits} bits is not a compressed-tensors weight format")
    # compressed-tensors stores scales (and zero points) in the model dtype
    zero = act_bits if w.get("symmetric", True) is False else 0
    base = f"{kind if kind == 'int' else 'fp'}{bits}"
    if strategy == "group" or (strategy is None and group):
        if not group:
            raise g.bad("group_size", "strategy group needs a group_size")
        return f"{base}-g{group}-s{act_bits}" + (f"-z{zero}" if zero else "")
    if strategy == "channel":
        return f"{base}-ch-s{act_bits}" + (f"-z{zero}" if zero else "")
    if strategy == "block":
        block = w.get("block_structure")
        if not (isinstance(block, list) and len(block) == 2 and block[0] == block[1]):
            raise g.bad("block_structure", f"expected a square [rows, cols], got {block!r}")
        return f"{base}-b{block[0]}-s{act_bits}"
    if strategy in ("tensor", None):
        return f"{base}-t{act_bits}"
    raise g.bad("strategy", f"unknown strategy {strategy!r}")


def _raise(exc: Exception) -> str:
    raise exc


def _compressed_tensors(f: _Field, act_bits: int, notes: list[str]) -> Scheme:
    groups_cfg = f.cfg.get("config_groups")
    if not isinstance(groups_cfg, dict) or not groups_cfg:
        raise f.bad("config_groups", "expected an object of quantization groups")
    groups = []
    for name, group in groups_cfg.items():
        if not isinstance(group, dict):
            raise f.bad(f"config_groups.{name}", "expected an object")
        gf = _Field(f"{f.where}.config_groups.{name}", group)
        targets = tuple(t for t in gf.patterns("targets") if t != "Linear")
        if group.get("weights") is not None:
            groups.append(Group(_ct_format(f, name, group["weights"], act_bits), targets))
    if f.cfg.get("sparsity_config"):
        notes.append(
            f"WARNING {f.where}.sparsity_config: sparse compression not modelled; weights counted dense"
        )
    return Scheme("compressed-tensors", tuple(groups), f.patterns("ignore"))


# ModelOpt quant_algo -> weight format. FP8: one fp32 weight_scale per tensor; NVFP4: fp8 scale per
# 16 values + an fp32 weight_scale_2 per tensor (TensorRT Model Optimizer export format).
_MODELOPT = {"FP8": "fp8-t32", "FP8_PER_CHANNEL_PER_TOKEN": "fp8-ch-s32", "NVFP4": "nvfp4",
             "W4A16_NVFP4": "nvfp4", "NVFP4_AWQ": "nvfp4", "W4A8_NVFP4_FP8": "nvfp4"}  # fmt: skip


def _modelopt_algo(f: _Field, key: str, algo: Any, notes: list[str]) -> str | None:
    fmt = _MODELOPT.get(str(algo).upper())
    if fmt is None:
        notes.append(
            f"WARNING {f.where}.{key}: ModelOpt algorithm {algo!r} not modelled; those weights counted unquantized"
        )
    return fmt


def _modelopt(f: _Field, notes: list[str]) -> Scheme:
    ignore = f.patterns("exclude_modules", "ignore")
    algo = f.cfg.get("quant_algo")
    if not isinstance(algo, str):
        raise f.bad("quant_algo", f"expected a string, got {algo!r}")
    if algo.upper() != "MIXED_PRECISION":
        fmt = _modelopt_algo(f, "quant_algo", algo, notes)
        return Scheme("modelopt", (Group(fmt),) if fmt else (), ignore)
    layers = f.cfg.get("quantized_layers")
    if not isinstance(layers, dict):
        raise f.bad("quantized_layers", "MIXED_PRECISION needs an object of module -> quant_algo")
    groups = []
    for module, spec in layers.items():
        if not isinstance(spec, dict):
            raise f.bad(f"quantized_layers.{module}", "expected an object with quant_algo")
        fmt = _modelopt_algo(f, f"quantized_layers.{module}.quant_algo", spec.get("quant_algo"), notes)
        if fmt:
            groups.append(Group(fmt, (module,)))
    return Scheme("modelopt", tuple(groups), ignore)


def read_scheme(quant: Any, where: str, act_bits: int, notes: list[str]) -> Scheme | None:
    """The quantization scheme of a config; None when the checkpoint is not quantized (or unknown:
    then a note names the field)."""
    if quant is None or quant == {}:
        return None
    if not isinstance(quant, dict):
        raise SpecError(f"{where}: expected an object, got {type(quant).__name__}")
    f = _Field(where, quant)
    method = str(quant.get("quant_method", "")).lower()
    if not method and "quant_algo" in quant:  # ModelOpt writes no quant_method in some exports
        method = "modelopt"
    readers: dict[str, Callable[[], Scheme]] = {
        "fp8": lambda: _fp8(f),
        "awq": lambda: _awq_gptq(f, "awq"),
        "gptq": lambda: _awq_gptq(f, "gptq"),
        "bitsandbytes": lambda: _bnb(f),
        "compressed-tensors": lambda: _compressed_tensors(f, act_bits, notes),
        "modelopt": lambda: _modelopt(f, notes),
        # gpt-oss: routed experts in MXFP4 (4 bits + an e8m0 scale per 32), everything else unquantized
        "mxfp4": lambda: Scheme(
            "mxfp4",
            (Group("mxfp4"),),
            f.patterns("modules_to_not_convert"),
            only=frozenset({"routed_experts"}),
        ),  # fmt: skip
    }
    if method not in readers:
        notes.append(
            f"WARNING {where}.quant_method {method or None!r} not modelled: weights counted at the "
            "model dtype; the checkpoint is likely smaller (give --weight-dtype)"
        )
        return None
    return readers[method]()


# --- module names ---------------------------------------------------------------------------------

_LAYER_PREFIXES = ("model.layers.{i}", "model.language_model.layers.{i}", "language_model.model.layers.{i}",
                   "backbone.layers.{i}", "layers.{i}", "model.decoder.layers.{i}")  # fmt: skip
_TOP_PREFIXES = (
    "",
    "model.",
    "language_model.",
    "model.language_model.",
    "language_model.model.",
    "backbone.",
)


def _glob(pattern: str) -> str:
    """A ModelOpt/transformers module pattern (fnmatch-style `*`) matching whole dotted segments."""
    body = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return rf"(?:^|\.){body}(?:\.|$)"


def _is_plain(pattern: str) -> bool:
    """A module name, not a regex or a wildcard pattern."""
    return not pattern.startswith("re:") and "*" not in pattern and "?" not in pattern


def _segment_runs(name: str, lengths: frozenset[int]) -> Iterator[str]:
    """The runs of whole dotted segments of a module name, of the lengths (in segments) the plain patterns have:
    a plain pattern matches the name if it is one (`layers.0.mlp` matches `model.layers.0.mlp.experts.gate_proj`)."""
    parts = name.split(".")
    for n in lengths:
        for a in range(len(parts) - n + 1):
            yield ".".join(parts[a : a + n])


def _lengths(names: Iterable[str]) -> frozenset[int]:
    return frozenset(n.count(".") + 1 for n in names)


def _regex(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern[3:])
    except re.error as exc:
        raise SpecError(
            f"quantization_config: module pattern {pattern!r} is not a valid regular expression ({exc}); "
            "fix or remove it in the config"
        ) from None


class Matcher:
    """Module patterns as checkpoints write them: `re:<regex>` (compressed-tensors, re.match on the
    full name), else a module name or fnmatch pattern matching a module or any of its parents."""

    def __init__(self, patterns: tuple[str, ...]) -> None:
        self.regexes = [_regex(p) for p in patterns if p.startswith("re:")]
        # A checkpoint lists hundreds of modules (DeepSeek-V3.2-NVFP4: 307), one regex of them all
        # searched at every position took 10 s: plain names are looked up by the runs of a name's
        # segments, and patterns with a wildcard are grouped by the layer they name, if any.
        self.literals = {p for p in patterns if _is_plain(p)}
        self.lengths = _lengths(self.literals)
        by_layer: dict[str | None, list[str]] = {}
        for p in patterns:
            if not p.startswith("re:") and not _is_plain(p):
                m = _LAYER_NUMBER.search(p)
                by_layer.setdefault(m.group(1) if m else None, []).append(_glob(p))
        self.wild = {k: re.compile("|".join(v)) for k, v in by_layer.items()}

    def __bool__(self) -> bool:
        return bool(self.regexes or self.literals or self.wild)

    def _glob_matches(self, name: str) -> bool:
        if self.literals and any(run in self.literals for run in _segment_runs(name, self.lengths)):
            return True
        if not self.wild:
            return False
        keys = [None, *_LAYER_NUMBER.findall(name)]
        return any(k in self.wild and self.wild[k].search(name) for k in keys)

    def any(self, names: list[str]) -> bool:
        for name in names:
            if self._glob_matches(name):
                return True
            if any(r.match(name) for r in self.regexes):
                return True
        return False


# `layers.12` as whole segments: a module of layer 12 (`layers.6*` names no one layer)
_LAYER_NUMBER = re.compile(r"(?:^|\.)layers\.(\d+)(?=\.|$)")


def module_names(m: Matrix) -> list[str]:
    """Full module names of a matrix, in the spellings checkpoints use."""
    names = m.names or (m.name,)
    if m.layer is None:
        return [p + n for p in _TOP_PREFIXES for n in names]
    return [f"{p.format(i=m.layer)}.{n}" for p in _LAYER_PREFIXES for n in names]


class _Groups:
    """The scheme's groups in order, the first that matches a module winning. A checkpoint that lists
    every module (ModelOpt MIXED_PRECISION quantized_layers: 401 groups of one name for Qwen3.6-27B)
    took 8 s tried group by group: groups of plain names are looked up by the runs of a name's whole
    segments (a Matcher literal matches such a run), the rest tried in order below the best hit."""

    def __init__(self, scheme: Scheme) -> None:
        self.groups = scheme.groups
        self.literal: dict[str, int] = {}  # a plain module name -> the first group listing it
        self.other: list[tuple[int, Matcher | None]] = []  # groups with patterns (None: targets all)
        for i, g in enumerate(scheme.groups):
            if g.targets and all(_is_plain(t) for t in g.targets):
                for t in g.targets:
                    self.literal.setdefault(t, i)
            else:
                self.other.append((i, Matcher(g.targets) if g.targets else None))
        self.lengths = _lengths(self.literal)

    def first(self, names: list[str]) -> int | None:
        best = len(self.groups)
        if self.literal:
            for name in names:
                for run in _segment_runs(name, self.lengths):
                    best = min(best, self.literal.get(run, best))
        for i, matcher in self.other:
            if i >= best:
                break
            if matcher is None or matcher.any(names):
                return i
        return best if best < len(self.groups) else None


def matrix_format(scheme: Scheme, groups: _Groups, ignore: Matcher, m: Matrix) -> str | None:
    """The format a matrix is stored in; None: the model dtype."""
    if m.component in ("router", "norms") or m.component in scheme.keep or not m.quantizable:
        return None
    if scheme.only is not None and m.component not in scheme.only:
        return None
    names = module_names(m)
    if ignore and ignore.any(names):
        return None
    i = groups.first(names)
    return None if i is None else scheme.groups[i].fmt


def resolve(spec: ModelSpec, scheme: Scheme) -> dict[str, str]:
    """Per-matrix formats collapsed into the spec's `weight_formats`: the commonest format of each
    component (by parameters), then `component.matrix` and `component.matrix@layer` exceptions."""
    ignore = Matcher(scheme.ignore)
    groups = _Groups(scheme)
    default = spec.weight_dtype
    mats = [m for m in weight_matrices(spec) if m.component not in ("router", "norms")]
    fmts = [matrix_format(scheme, groups, ignore, m) or default for m in mats]
    out: dict[str, str] = {}

    def commonest(pairs: list[tuple[Matrix, str]]) -> str:
        weight: Counter[str] = Counter()
        for m, fmt in pairs:
            weight[fmt] += m.params
        return weight.most_common(1)[0][0]

    by_comp: dict[str, list[tuple[Matrix, str]]] = {}
    for m, fmt in zip(mats, fmts, strict=True):
        by_comp.setdefault(m.component, []).append((m, fmt))
    for comp, pairs in by_comp.items():
        top = out[comp] = commonest(pairs)
        by_name: dict[str, list[tuple[Matrix, str]]] = {}
        for m, fmt in pairs:
            by_name.setdefault(m.name, []).append((m, fmt))
        for name, named in by_name.items():
            common = commonest(named)
            if common != top:
                out[f"{comp}.{name}"] = common
            for m, fmt in named:
                if fmt != common:
                    out[f"{comp}.{name}@{m.layer}"] = fmt
    return out


# --- files beside config.json -----------------------------------------------------------------------


def sidecar_present(path: Path) -> bool:
    """Whether a file beside config.json is there to read: a directory, FIFO or broken link of its name counts,
    so that read_sidecar refuses it in one line instead of the model planning without it."""
    return path.exists() or path.is_symlink()


def read_sidecar(path: Path) -> Any:
    """A JSON file beside config.json, size- and nesting-bounded; any problem is one SpecError."""
    return load_json_text(read_text(path, MAX_INDEX_FILE_BYTES), path)


def quant_config(top: dict, cfg: dict, path: Path) -> tuple[Any, str]:
    """config.json's quantization_config, else ModelOpt's hf_quant_config.json beside it (as vLLM)."""
    for where, source in (("quantization_config", top), ("text_config.quantization_config", cfg)):
        if source.get("quantization_config") is not None:
            return source["quantization_config"], f"{path}: {where}"
    beside = path.parent / "hf_quant_config.json"
    if sidecar_present(beside):
        data = read_sidecar(beside)
        if not isinstance(data, dict) or not isinstance(data.get("quantization"), dict):
            raise SpecError(f"{beside}: quantization: expected an object (ModelOpt's hf_quant_config.json)")
        return {"quant_method": "modelopt", **data["quantization"]}, f"{beside}: quantization"
    return None, str(path)


def kv_cache_dtype(quant: Any) -> str | None:
    """The KV format a quantization config names: ModelOpt's kv_cache_quant_algo FP8 (hf_quant_config.json) or
    compressed-tensors' kv_cache_scheme of 8-bit floats; the engines' --kv-cache-dtype auto takes it."""
    if not isinstance(quant, dict):
        return None
    if str(quant.get("kv_cache_quant_algo") or "").upper() == "FP8":
        return "fp8_e4m3"
    scheme = quant.get("kv_cache_scheme")
    if isinstance(scheme, dict) and scheme.get("num_bits") == 8 and scheme.get("type") == "float":
        return "fp8_e4m3"
    return None


def has_pooling_config(path: Path) -> bool:
    """A sentence-transformers modules.json beside config.json naming a Pooling module: vLLM then
    serves the model as a pooling (embedding) model (vllm/config/model.py _get_default_runner_type,
    get_pooling_config)."""
    beside = path.parent / "modules.json"
    if path.name != "config.json" or not beside.is_file():
        return False
    modules = read_sidecar(beside)
    if not isinstance(modules, list):
        raise SpecError(f"{beside}: expected a list of modules (sentence-transformers modules.json)")
    return any(isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling") for m in modules)


def checkpoint_layers_beyond(path: Path, num_layers: int) -> bool:
    """Whether the index's weight_map names a decoder layer past the model's last (an MTP layer kept in the
    checkpoint: DeepSeek's model.layers.61.*); True when it cannot tell."""
    index = path.parent / "model.safetensors.index.json"
    data = read_sidecar(index) if sidecar_present(index) else None
    names = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(names, dict) or not names:
        return True
    past = re.compile(rf"(?:^|\.)layers\.{num_layers}\.|(?:^|\.)(?:mtp|nextn)")  # Qwen3.5: mtp.layers.0.*
    return any(past.search(str(name)) for name in names)


def checkpoint_weight_bytes(path: Path) -> int | None:
    """metadata.total_size of model.safetensors.index.json beside config.json: the checkpoint's bytes."""
    index = path.parent / "model.safetensors.index.json"
    if not sidecar_present(index):
        return None
    data = read_sidecar(index)
    meta = data.get("metadata", {}) if isinstance(data, dict) else None
    if not isinstance(meta, dict):
        raise SpecError(
            f"{index}: metadata: expected a mapping, got {type(meta).__name__ if meta is not None else 'null'}"
        )
    total = meta.get("total_size")
    if isinstance(total, str) and total.isdigit():  # some exporters write it as a string
        total = int(total)
    if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
        raise SpecError(f"{index}: metadata.total_size: expected a positive integer, got {total!r}")
    if total > MAX_BYTES:
        raise SpecError(
            f"{index}: metadata.total_size: {total:,} is over kvplan's limit of {MAX_BYTES:,} (README, Limits)"
        )
    return total
