"""Trace replay: Mooncake's JSONL (github.com/kvcache-ai/Mooncake, FAST25-release/traces) and the
Azure LLM inference trace CSV (github.com/Azure/AzurePublicDataset: TIMESTAMP, ContextTokens,
GeneratedTokens). Every problem is one line naming the file and line, and what to do."""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import datetime, timezone
from pathlib import Path

from kvplan.errors import SpecError, UsageError
from kvplan.limits import read_regular
from kvplan.simulator.request import MASK, RequestSpec
from kvplan.simulator.workload import MAX_REQUESTS, MAX_TOKENS_PER_REQUEST, Workload
from kvplan.units import plural

MAX_TRACE_BYTES = 256 * 2**20
MOONCAKE_BLOCK_TOKENS = 512  # a hash id names 512 tokens (FAST25-release/README.md)


def _bad(path: Path, line: int, what: str) -> UsageError:
    return UsageError(f"{path}:{line}: {what}")


def _length(value: object, path: Path, line: int, name: str) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not math.isfinite(value))
    ):
        raise _bad(path, line, f"{name} must be a whole number of tokens, got {value!r}")
    if value != int(value) or not 1 <= value <= MAX_TOKENS_PER_REQUEST:
        raise _bad(
            path,
            line,
            f"{name} must be 1 to {MAX_TOKENS_PER_REQUEST:,} tokens, got {value!r}; fix or drop the line",
        )
    return int(value)


# a Mooncake timestamp is milliseconds (from the trace's start, or epoch ms at most): 1e13 ms is the year 2286
MAX_TIMESTAMP_MS = 1e13


def _time(value: float, last: float, path: Path, line: int) -> float:
    if not math.isfinite(value) or value < 0:
        raise _bad(path, line, f"the timestamp must be a finite number >= 0, got {value!r}")
    if value < last:
        raise _bad(
            path, line, f"timestamps must not go backwards ({value:g} after {last:g}); sort the trace by time"
        )
    return value


def mooncake_units(hash_ids: list[int], input_tokens: int) -> tuple[tuple[int, int], ...]:
    """The prompt's runs: hash id i names tokens 512 i .. 512 (i + 1) (the last one shorter)."""
    units = []
    for i, h in enumerate(hash_ids):
        tokens = min(MOONCAKE_BLOCK_TOKENS, input_tokens - i * MOONCAKE_BLOCK_TOKENS)
        units.append((hash((h, tokens)) & MASK, tokens))
    return tuple(units)


def read_mooncake(path: Path, text: str) -> list[RequestSpec]:
    reqs: list[RequestSpec] = []
    last = 0.0
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, RecursionError):
            raise _bad(
                path, n, "not a JSON object; each line is {timestamp, input_length, output_length, hash_ids}"
            ) from None
        if not isinstance(row, dict) or not {"timestamp", "input_length", "output_length"} <= set(row):
            raise _bad(path, n, "needs timestamp (ms), input_length, output_length (and hash_ids)")
        ts = row["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, int | float):
            raise _bad(path, n, f"timestamp must be a number of milliseconds, got {ts!r}")
        try:
            seconds = float(ts)
        except OverflowError:  # an int past float's range
            seconds = math.inf
        if math.isfinite(seconds) and seconds > MAX_TIMESTAMP_MS:
            raise _bad(
                path,
                n,
                f"timestamp {seconds:.3g} ms is past any trace's clock (epoch milliseconds reach "
                f"{MAX_TIMESTAMP_MS:.0e} in the year 2286); give milliseconds from the trace's start",
            )
        t = _time(seconds, last, path, n)
        last = t
        inp = _length(row["input_length"], path, n, "input_length")
        out = _length(row["output_length"], path, n, "output_length")
        ids = row.get("hash_ids", [])
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise _bad(path, n, "hash_ids must be a list of integers")
        if len(ids) > -(-inp // MOONCAKE_BLOCK_TOKENS):
            raise _bad(path, n, f"{len(ids)} hash_ids name more than input_length {inp:,} tokens (512 each)")
        units = mooncake_units(ids, inp)
        covered = len(ids) * MOONCAKE_BLOCK_TOKENS
        if covered < inp:  # tokens no hash id names: this prompt's own
            units = (*units, (hash(("tail", path.name, n)) & MASK, inp - min(covered, inp)))
        reqs.append(RequestSpec(t / 1e3, inp, out, units))
        if len(reqs) > MAX_REQUESTS:
            raise _bad(path, n, f"more than {MAX_REQUESTS:,} requests; replay a part of the trace")
    return reqs


def _azure_time(text: str) -> tuple[float, str]:
    """(seconds, its kind: 'number', 'local' date-time or 'zoned' date-time with an offset)."""
    try:
        return float(text), "number"
    except ValueError:
        pass
    head, dot, frac = text.strip().partition(".")
    zone = ""
    if dot:  # the fraction may end in an offset: .1234567+00:00
        digits = len(frac) - len(frac.lstrip("0123456789"))
        frac, zone = frac[:digits], frac[digits:]
    stamp = datetime.fromisoformat(head + (dot + frac[:6] if dot else "") + zone)
    if (
        stamp.tzinfo is None
    ):  # read as UTC, not this machine's zone: a daylight-saving change adds or drops an hour
        return stamp.replace(tzinfo=timezone.utc).timestamp(), "local"
    return stamp.timestamp(), "zoned"


_KIND_WORDS = {"number": "a plain number", "local": "a date-time without a time zone",
               "zoned": "a date-time with a time zone"}  # fmt: skip


def read_azure(path: Path, text: str) -> list[RequestSpec]:
    lines = text.splitlines()
    header = [h.strip() for h in lines[0].split(",")] if lines else []
    try:
        cols = [header.index(c) for c in ("TIMESTAMP", "ContextTokens", "GeneratedTokens")]
    except ValueError:
        raise _bad(
            path, 1, "the header must name TIMESTAMP, ContextTokens, GeneratedTokens (Azure LLM trace)"
        ) from None
    reqs: list[RequestSpec] = []
    first: float | None = None
    last = 0.0
    first_kind: tuple[str, int] | None = None  # the first timestamp's kind and line
    for n, raw in enumerate(lines[1:], 2):
        if not raw.strip():
            continue
        parts = raw.split(",")
        if len(parts) != len(header):
            raise _bad(path, n, f"{len(parts)} fields, the header has {len(header)}")
        try:
            stamp, kind = _azure_time(parts[cols[0]])
            inp_v, out_v = float(parts[cols[1]]), float(parts[cols[2]])
        except (ValueError, OverflowError):
            raise _bad(path, n, "cannot read the timestamp or the token counts") from None
        if not math.isfinite(stamp):
            raise _bad(path, n, "the timestamp must be finite")
        first_kind = first_kind or (kind, n)
        if kind != first_kind[0]:
            raise _bad(
                path, n, f"this timestamp is {_KIND_WORDS[kind]}, line {first_kind[1]}'s is "
                f"{_KIND_WORDS[first_kind[0]]}; write every timestamp the same way"
            )  # fmt: skip
        first = stamp if first is None else first
        t = stamp - first  # >= 0 while the trace is sorted: the first line is then its earliest
        if t < last:
            raise _bad(path, n, "timestamps must not go backwards (this one is earlier than the line "
                       "before); sort the trace by time")  # fmt: skip
        last = t
        inp = _length(inp_v, path, n, "ContextTokens")
        out = _length(out_v, path, n, "GeneratedTokens")
        reqs.append(RequestSpec(t, inp, out))
        if len(reqs) > MAX_REQUESTS:
            raise _bad(path, n, f"more than {MAX_REQUESTS:,} requests; replay a part of the trace")
    return reqs


def read_trace(
    path: str | Path, max_concurrency: int | None = None, num_prompts: int | None = None
) -> Workload:
    """A Mooncake .jsonl or an Azure .csv trace as a workload (the first num_prompts requests)."""
    if not str(path).strip():
        raise UsageError(
            "--trace: empty; give a Mooncake .jsonl or an Azure .csv file, or leave the flag out"
        )
    p = Path(path)
    try:
        if p.is_dir():
            raise UsageError(f"{p}: a directory, not a regular file; give the trace file itself")
        data = read_regular(p, MAX_TRACE_BYTES)
    except SpecError as exc:  # missing, a FIFO, too large: the same one line
        raise UsageError(str(exc)) from None
    except OSError as exc:  # a name the system will not look up (over 255 bytes a part)
        raise UsageError(f"{str(p)[:80]}: cannot read ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(f"{p}: not UTF-8 text; give a Mooncake .jsonl or an Azure .csv trace") from None
    if not text.strip():
        raise UsageError(f"{p}: empty file; give a Mooncake .jsonl or an Azure .csv trace")
    is_csv = p.suffix.lower() == ".csv" or text.lstrip().startswith("TIMESTAMP")
    reqs = read_azure(p, text) if is_csv else read_mooncake(p, text)
    if not reqs:
        raise UsageError(f"{p}: no requests in the file")
    if num_prompts is not None:
        if isinstance(num_prompts, bool) or not 1 <= num_prompts <= MAX_REQUESTS:
            raise UsageError(f"--num-prompts must be 1 to {MAX_REQUESTS:,}, got {num_prompts}")
        reqs = reqs[:num_prompts]
    kind = "Azure LLM trace" if is_csv else "Mooncake trace"
    cap = f", at most {max_concurrency:,} in flight" if max_concurrency else ""
    # the replay starts with the first request, as a benchmark started then would (a slice of a trace
    # starts late; replayed as it stands the idle lead-in would count as time served)
    offset = reqs[0].arrival_s
    since = f" (from the first, at {offset:,.3f} s in the file)" if offset > 0 else ""
    if offset > 0:
        reqs = [dataclasses.replace(r, arrival_s=r.arrival_s - offset) for r in reqs]
    return Workload(
        tuple(reqs),
        max_concurrency,
        f"{kind} {p.name}: {plural(len(reqs), 'request')} at {'its timestamp' if len(reqs) == 1 else 'their timestamps'}{since}{cap}",
    )
