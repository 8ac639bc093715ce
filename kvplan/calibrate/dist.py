"""All-reduces of decode message sizes, per world size: run under torchrun, one process per GPU.

`kvplan calibrate` starts this itself over every local GPU (`python -m torch.distributed.run
--standalone --nproc-per-node N -m kvplan.calibrate.dist ...`); across nodes, run it on each node:

    torchrun --nnodes 2 --node-rank R --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint HEAD:29500 -m kvplan.calibrate.dist --output profile.yaml

NCCL on GPUs (bf16 messages), gloo on CPUs (fp32). A decode step all-reduces batch x hidden x 2
bytes twice per layer: 8 KiB .. 16 MiB. Every world size 2, 4, ... up to the whole world is
measured in one launch (groups of the first ranks); each message size is timed as loops of
back-to-back all-reduces, the median loop per rank, the slowest rank kept. Rank 0 fits
time = latency + bytes / bandwidth per world size and writes the profile: into --output when it
is already a kvplan profile (its all-reduce entries of the same world sizes replaced), else a
new profile holding the all-reduces only.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvplan.calibrate import calibration
from kvplan.calibrate.calibration import AllreduceFit, AllreducePoint, Profile, fit_latency_bandwidth
from kvplan.calibrate.device import blank_profile, check_output, require_torch
from kvplan.errors import KvplanError, UsageError

KiB = 1 << 10
MESSAGE_BYTES = tuple(8 * KiB << i for i in range(12))  # 8 KiB .. 16 MiB
QUICK_MESSAGE_BYTES = MESSAGE_BYTES[::2] + (MESSAGE_BYTES[-1],)  # 8 KiB, 32 KiB, .. 8 MiB, 16 MiB
PROGRESS = "allreduce:"  # rank 0's progress lines start so; the parent forwards only those
SPAWN_TIMEOUT_S = {True: 300, False: 900}


def world_sizes(world: int) -> list[int]:
    """2, 4, 8, ... below `world`, and `world` itself."""
    sizes, ws = [], 2
    while ws < world:
        sizes.append(ws)
        ws *= 2
    return [*sizes, world] if world >= 2 else []


def _time_allreduce(torch: Any, dist: Any, group: Any, device: str, nbytes: int, quick: bool) -> float:
    """Median seconds per all-reduce of an `nbytes` message on this rank (loops of back-to-back
    calls after a sync, so rank skew is amortised), then the slowest rank's."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    elem = 2 if device == "cuda" else 4
    msg = torch.zeros(nbytes // elem, dtype=dtype, device=device)  # zeros: sums stay finite
    tick = torch.zeros(1, device=device)
    if device == "cuda":
        iters, reps = 20, 5 if quick else 10
    else:
        iters, reps = (10 if nbytes <= 1 << 20 else 3), 5
    for _ in range(3):
        dist.all_reduce(msg, group=group)
    per_call = []
    for _ in range(reps):
        dist.all_reduce(tick, group=group)  # every rank starts the loop together
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                dist.all_reduce(msg, group=group)
            end.record()
            end.synchronize()
            per_call.append(start.elapsed_time(end) / 1e3 / iters)
        else:
            t = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(msg, group=group)
            per_call.append((time.perf_counter() - t) / iters)
    slowest = torch.tensor([statistics.median(per_call)], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return float(slowest.item())


def measure(
    torch: Any, dist: Any, device: str, quick: bool, progress: Callable[[str], None]
) -> list[AllreduceFit]:
    """Every world size's points and fit (complete on rank 0; other ranks get their share)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    backend = str(dist.get_backend())
    sizes = QUICK_MESSAGE_BYTES if quick else MESSAGE_BYTES
    fits = []
    for ws in world_sizes(world):
        group = dist.new_group(list(range(ws))) if ws < world else None  # every rank creates every group
        if rank >= ws:
            continue
        points = [AllreducePoint(b, _time_allreduce(torch, dist, group, device, b, quick)) for b in sizes]
        latency, bytes_per_s, err = fit_latency_bandwidth([(p.bytes, p.seconds) for p in points])
        nodes = len(set(hosts[:ws]))
        fit = AllreduceFit(
            backend=backend,
            world_size=ws,
            nodes=nodes,
            dtype="bf16" if device == "cuda" else "fp32",
            latency_seconds=latency,
            bytes_per_s=bytes_per_s,
            bus_bytes_per_s=bytes_per_s * 2 * (ws - 1) / ws,
            rms_relative_error=err,
            points=points,
        )
        fits.append(fit)
        progress(
            f"{PROGRESS} {backend} x{ws} ({nodes} node{'s' if nodes > 1 else ''}): "
            + " ".join(f"{p.bytes // KiB}K:{p.seconds * 1e6:,.0f}us" for p in points)
            + f"; fit {latency * 1e6:,.1f} us + bytes / {bytes_per_s / 1e9:,.2f} GB/s "
            f"(bus {fit.bus_bytes_per_s / 1e9:,.2f} GB/s), rms error {err:.1%}"
        )
    return fits


def write(path: Path, fits: list[AllreduceFit], device: str, quick: bool, force: bool = False) -> Profile:
    """Rank 0: merge into the kvplan profile at `path`, else write a new all-reduce-only one (over
    a file that is not a kvplan profile only with `force`)."""
    existing = None
    if path.exists():
        try:
            existing = calibration.load(path)
        except KvplanError:
            if not force:
                raise
    if existing is not None:
        _check_merge(path, device)
        prof = existing.with_allreduce(fits)
    else:
        prof = blank_profile(device, quick).with_allreduce(fits)
    calibration.save(prof, path)
    return prof


def _check_merge(path: Path, device: str) -> None:
    """An existing profile at `path` takes these all-reduces only if it describes this device kind."""
    try:
        prof = calibration.load(path) if path.exists() else None
    except KvplanError:
        return  # not a profile: check_output has refused it, or --force replaces it
    if prof is not None and prof.device != device:
        raise UsageError(f"--output {path}: a {prof.device} profile; these all-reduces run on {device}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvplan.calibrate.dist", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default=None, help="default: cuda if there is one"
    )
    parser.add_argument("--output", required=True, help="the profile to write or merge into (.yaml)")
    parser.add_argument("--quick", action="store_true", help="fewer message sizes and repeats")
    parser.add_argument(
        "--force", action="store_true", help="replace an --output that is not a kvplan profile"
    )
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except KvplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if "LOCAL_RANK" not in os.environ:
        raise UsageError(
            "kvplan.calibrate.dist runs under torchrun: torchrun --nproc-per-node N -m kvplan.calibrate.dist ..."
        )
    out = Path(args.output)
    rank = int(os.environ.get("RANK", "0"))
    device = args.device or ("cuda" if _cuda_available() else "cpu")
    if rank == 0:  # before measuring: the other ranks cannot be told of a late failure
        check_output(out, args.force)
        _check_merge(out, device)
    torch = require_torch(device)
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    try:
        say = (lambda line: print(line, file=sys.stderr, flush=True)) if rank == 0 else (lambda line: None)
        fits = measure(torch, dist, device, args.quick, say)
        if rank == 0:
            write(out, fits, device, args.quick, args.force)
            say(f"{PROGRESS} saved {out}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def spawn(device: str, nproc: int, quick: bool, progress: Callable[[str], None]) -> list[AllreduceFit]:
    """`kvplan calibrate`'s all-reduce part: torchrun over `nproc` local processes (GPUs), the
    same code path as a manual torchrun; its fits read back from the profile rank 0 wrote."""
    with tempfile.TemporaryDirectory(prefix="kvplan-allreduce-") as tmp:
        out = Path(tmp) / "allreduce.yaml"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "kvplan.calibrate.dist", "--device", device, "--output", str(out),
        ] + (["--quick"] if quick else [])  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        progress(f"all-reduce over {nproc} processes: {' '.join(cmd[1:])}")
        tail = _run_forwarding(cmd, env, progress, SPAWN_TIMEOUT_S[quick])
        if not out.exists():
            raise UsageError(f"the all-reduce run (torchrun, {nproc} processes) failed: {tail}")
        return calibration.load(out).allreduce


def _run_forwarding(
    cmd: list[str], env: dict[str, str], progress: Callable[[str], None], timeout_s: int
) -> str:
    """Run `cmd`, forwarding rank 0's progress lines; the last other line, for an error message."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killer = threading.Timer(timeout_s, proc.kill)
    killer.start()
    last = error = ""
    # SIGTERM (timeout, a job scheduler) as an exit, so that the finally below stops torchrun, which stops
    # its workers, and the temporary folder is removed (the default action would orphan both)
    previous = (
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        if threading.current_thread() is threading.main_thread()
        else None
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.strip()
            if line.startswith(PROGRESS):
                progress("  " + line)
            elif line.startswith("error: "):
                error = line.removeprefix("error: ")
            elif line:
                last = line
        proc.wait()
    finally:
        killer.cancel()
        if proc.poll() is None:  # interrupted (Ctrl-C, SIGTERM): torchrun forwards the signal to its workers
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return f"exit {proc.returncode}: {(error or last)[:300]}"


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
