"""The burn-in's kernels on one GPU: GEMM throughput and result digests, device-memory bandwidth,
pinned host↔device bandwidth, a memory test, and a sustained load. Imports torch; run as a child
process by ``gpud.probe.stress_run`` (``python -m gpud.probe.stress SPEC.json``), never imported
by the daemon or the command line.

Every figure is measured here; judging it is ``gpud.burnin``'s job. On ``cpu`` the figures are the
host's (the report labels them CPU figures). Results are deterministic: the same seed, the same
shapes and deterministic algorithms give the same bits on every GPU of one model, so a GPU whose
digest differs from its siblings' computed something else (gpu-burn compares each result with its own
first within an epsilon; deterministic kernels allow bit for bit, across GPUs too).

A spec's ``faults`` (GPU → a list of ``wrong_results``, ``memory_errors``) make the device misbehave: a
simulated workstation asks for them for a GPU with such a fault, because the CPU that stands in for
that GPU cannot misbehave by itself; nothing else sets them. On ``cpu`` one child measures every
GPU's stand-in in turn (one torch import, not one per GPU).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Any

import torch

DTYPES = {"bf16": torch.bfloat16, "tf32": torch.float32, "fp32": torch.float32}
# The small product's error against the float64 host product, elementwise, within the bound of a dot
# product of k terms (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., 2002, §3.1 and
# eq. (3.13)): |C - fl(AB)| <= (2 u_in + gamma_k(u_acc) + u_out) |A||B|, gamma_k(u) = k u / (1 - k u), with
# u_in the rounding of the inputs to the format the tensor cores take (tf32: 10 explicit bits, 2^-11; bf16
# and fp32 inputs are exact), u_acc the accumulation's (fp32, 2^-24: PyTorch accumulates bf16 GEMMs in fp32
# with reduced-precision reductions off, as the child sets them) and u_out the result's rounding (bf16: 8
# significand bits, 2^-8). The check is the worst element's error as a share of its bound: at most 1.
UNIT_ROUNDOFF = {"bf16": (0.0, 2.0**-24, 2.0**-8), "tf32": (2.0**-11, 2.0**-24, 0.0), "fp32": (0.0, 2.0**-24, 0.0)}
REFERENCE_RTOL = {name: 1.0 for name in UNIT_ROUNDOFF}  # the bound's share allowed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_FAULTS: dict[str, list[str]] = {"now": []}


def _fault(kind: str) -> bool:
    return kind in _FAULTS["now"]


def _inputs(n: int, dtype: torch.dtype, device: torch.device, seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(n, n, generator=gen, dtype=torch.float32, device="cpu")
    b = torch.randn(n, n, generator=gen, dtype=torch.float32, device="cpu")
    return a.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype)


def gemm(device: torch.device, name: str, n: int, seconds: float) -> dict[str, Any]:
    """Throughput (TFLOP/s, 2n³ per product) over ``seconds``, the result's digest, and a check of a
    small product against a float64 reference computed on the host."""
    dtype = DTYPES[name]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False  # fp32 sums (the bound)
    a, b = _inputs(n, dtype, device)
    c = a @ b
    _sync(device)
    reps, start = 0, time.perf_counter()
    while True:
        c = a @ b
        reps += 1
        if reps % 4 == 0:
            _sync(device)
            if time.perf_counter() - start >= seconds:
                break
    _sync(device)
    elapsed = time.perf_counter() - start
    out = c.float().cpu().contiguous()
    if _fault("wrong_results"):
        out.view(-1)[0] += 1.0
    digest = hashlib.sha256(out.numpy().tobytes()).hexdigest()
    # A small case against the host's float64 product.
    sa, sb = _inputs(64, dtype, device, seed=99)
    small = (sa @ sb).double().cpu()
    if _fault("wrong_results"):
        small[0, 0] += 1.0
    a64, b64 = sa.double().cpu(), sb.double().cpu()
    ref = a64 @ b64
    u_in, u_acc, u_out = UNIT_ROUNDOFF[name]
    k = a64.shape[1]
    bound = (2 * u_in + k * u_acc / (1 - k * u_acc) + u_out) * (a64.abs() @ b64.abs())
    err = float(((small - ref).abs() / bound.clamp_min(1e-300)).max().item())
    return {"dtype": name, "n": n, "tflops": 2.0 * n**3 * reps / elapsed / 1e12, "digest": digest,
            "reference_error": err, "reference_rtol": REFERENCE_RTOL[name],
            "reference_ok": err <= REFERENCE_RTOL[name]}


def device_bandwidth(device: torch.device, mib: int, seconds: float) -> dict[str, Any]:
    """Device-to-device copy: bytes read plus bytes written per second (GB/s)."""
    src = torch.ones(mib * 2**18, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or reps < 3:
        dst.copy_(src)
        reps += 1
        _sync(device)
    elapsed = time.perf_counter() - start
    return {"gbps": 2.0 * src.numel() * 4 * reps / elapsed / 1e9, "mib": mib}


def host_bandwidth(device: torch.device, mib: int, seconds: float) -> dict[str, Any]:
    """Pinned host memory ↔ device (GB/s each way); the parent pins the process to the GPU's NUMA node."""
    pin = device.type == "cuda"
    host = torch.ones(mib * 2**18, dtype=torch.float32, device="cpu")
    if pin:
        host = host.pin_memory()
    dev = torch.empty(host.numel(), dtype=torch.float32, device=device)
    out: dict[str, Any] = {"mib": mib, "pinned": pin}
    for direction in ("h2d", "d2h"):
        dst, src = (dev, host) if direction == "h2d" else (host, dev)
        dst.copy_(src, non_blocking=pin)
        _sync(device)
        reps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 2 or reps < 3:
            dst.copy_(src, non_blocking=pin)
            reps += 1
            _sync(device)
        out[f"{direction}_gbps"] = host.numel() * 4 * reps / (time.perf_counter() - start) / 1e9
    return out


# The memory test's patterns (DCGM's memtest plugin, after memtest86 and cuda_memtest; memtest86+'s README
# describes each algorithm): 64-bit words, so an address written into its own word never wraps.
MEMTEST_PATTERNS = ("walking_ones", "walking_zeros", "moving_inversions", "random", "address", "bit_fade")
MEMTEST_CHUNK_MIB = 256  # the expected values are made one chunk at a time: the test holds most of the memory
LOCATE_MAX = 64  # mismatching words located per chunk and pattern (the count is always whole)
RANGE_GAP_BYTES = 2**20  # mismatches closer than this are one range in the summary


def memtest(device: torch.device, mib: int, seconds: float = 0.0, fade_s: float = 0.0, seed: int = 0,
            chunk_mib: int = MEMTEST_CHUNK_MIB) -> dict[str, Any]:
    """A memory test over ``mib`` MiB held at once, in 64-bit words, repeated in passes until ``seconds``
    have gone (at least one pass), then a bit-fade pass. Each pass: walking ones and walking zeros (64
    patterns each: every data line), moving inversions of all ones and all zeros (memtest86's algorithm:
    ascending, check and write the complement; descending, check and write it back), random words from a
    seed (a new sequence each pass) and their inversion, and each word's own 64-bit address and its
    complement. The bit-fade pass (memtest86+'s test 10) writes all zeros, waits ``fade_s``, checks, and
    the same with all ones: cells that lose their charge. Returns the mismatching words per pattern and
    where they lie (byte offsets in the tested block, and the block's device address)."""
    words = mib * 2**17
    step = max(1, chunk_mib * 2**17)
    buf = torch.empty(words, dtype=torch.int64, device=device)
    base = int(buf.data_ptr())
    errors = dict.fromkeys(MEMTEST_PATTERNS, 0)
    where: list[int] = []  # byte offsets of mismatching words (at most LOCATE_MAX per chunk and check)
    # A simulated GPU's fault: its stand-in's memory has a weak cell that does not hold bit 0.
    weak = (words * 5) // 8 if _fault("memory_errors") else None

    def spans() -> list[tuple[int, int]]:
        return [(lo, min(step, words - lo)) for lo in range(0, words, step)]

    def wrote(lo: int, n: int) -> None:
        if weak is not None and lo <= weak < lo + n:
            buf[weak] ^= 1

    def fill(value: int) -> None:
        buf.fill_(value)
        wrote(0, words)

    def count(name: str, lo: int, n: int, expected: torch.Tensor | int) -> None:
        bad = buf[lo:lo + n] != expected
        k = int(bad.sum().item())
        if k:
            errors[name] += k
            idx = bad.nonzero()[:LOCATE_MAX].view(-1)
            where.extend(int(i) * 8 + lo * 8 for i in idx.tolist())

    def addresses(lo: int, n: int) -> torch.Tensor:
        return torch.arange(lo, lo + n, dtype=torch.int64, device=device) * 8 + base

    def randoms(lo: int, n: int, k: int) -> torch.Tensor:
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + k * 100_003 + lo // step)
        return torch.randint(-(2**63), 2**63 - 1, (n,), generator=gen, dtype=torch.int64, device=device)

    def one_pass(k: int) -> None:
        for bit in range(64):
            for name, value in (("walking_ones", 1 << bit), ("walking_zeros", ~(1 << bit))):
                value = (value + 2**63) % 2**64 - 2**63  # as a signed 64-bit word
                fill(value)
                for lo, n in spans():
                    count(name, lo, n, value)
        for value in (0, -1):  # moving inversions, all zeros and all ones
            fill(value)
            for lo, n in spans():
                count("moving_inversions", lo, n, value)
                buf[lo:lo + n] = ~value
                wrote(lo, n)
            for lo, n in reversed(spans()):
                count("moving_inversions", lo, n, ~value)
                buf[lo:lo + n] = value
                wrote(lo, n)
            for lo, n in spans():
                count("moving_inversions", lo, n, value)
        for lo, n in spans():
            buf[lo:lo + n] = randoms(lo, n, k)
            wrote(lo, n)
        for lo, n in spans():
            want = randoms(lo, n, k)
            count("random", lo, n, want)
            buf[lo:lo + n] = ~want
            wrote(lo, n)
        for lo, n in spans():
            count("random", lo, n, ~randoms(lo, n, k))
        for invert in (False, True):
            for lo, n in spans():
                buf[lo:lo + n] = ~addresses(lo, n) if invert else addresses(lo, n)
                wrote(lo, n)
            for lo, n in spans():
                count("address", lo, n, ~addresses(lo, n) if invert else addresses(lo, n))

    start = time.perf_counter()
    passes, longest = 0, 0.0
    budget = max(0.0, seconds - 2 * fade_s)
    while passes == 0 or time.perf_counter() - start + longest <= budget:
        t = time.perf_counter()
        one_pass(passes)
        _sync(device)
        longest = max(longest, time.perf_counter() - t)
        passes += 1
    for value in (0, -1):
        fill(value)
        _sync(device)
        time.sleep(max(0.0, fade_s))
        for lo, n in spans():
            count("bit_fade", lo, n, value)
    _sync(device)
    return {"mib": mib, "word_bits": 64, "passes": passes, "seconds": round(time.perf_counter() - start, 3),
            "fade_s": fade_s, "seed": seed, "base": hex(base), "errors": errors,
            "total_errors": sum(errors.values()), "ranges": _ranges(where)}


def _ranges(offsets: list[int]) -> list[list[int]]:
    """The located mismatches as [first byte, last byte, words located] ranges (at most 8), nearby ones
    (within ``RANGE_GAP_BYTES``) merged: a bad cell, a bad row, or a region."""
    out: list[list[int]] = []
    for off in sorted(set(offsets)):
        if out and off - out[-1][1] <= RANGE_GAP_BYTES:
            out[-1][1] = off
            out[-1][2] += 1
        else:
            out.append([off, off, 1])
    return out[:8]


# The fp32 product's error bound (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., 2002,
# §3.5, eq. (3.13)): |C - fl(AB)| <= gamma_k |A||B| elementwise, gamma_k = k u / (1 - k u), u = 2^-24 for
# IEEE single precision, whatever the order of the sums (cuBLAS's split-k included). TF32 is off for it.
FP32_UNIT_ROUNDOFF = 2.0**-24
# The host checks the rows of the first product it can afford: at most this many multiply-adds in float64.
HOST_REFERENCE_MACS = 2e9


def checksum(t: torch.Tensor) -> int:
    """The product's bits summed as 64-bit integers: two products with the same bits have the same sum, one
    flipped bit changes it. Cheap on the device, so siblings can compare each report's last product."""
    return int(t.contiguous().view(torch.int32).to(torch.int64).sum().item())


CHECKED_DTYPES = ("fp32", "tf32", "bf16")  # the load's products: the training dtypes, each checked hot
_BITS = {"fp32": torch.int32, "tf32": torch.int32, "bf16": torch.int16}  # the product's words, compared bit for bit


class Checked:
    """The sustained load's products, checked: the same inputs each iteration, one product of each dtype (fp32,
    tf32 and bf16, the dtypes training runs in), each compared bit for bit with the GPU's first of that dtype
    (deterministic kernels: the same bits every time on a sound GPU; gpu-burn compares each result with its
    first within an epsilon), and the first fp32 product's leading rows with the host's float64 product (the
    same kernel, on the rows the host can afford; Higham's bound). The checksum the siblings compare is the
    last fp32 product's."""

    def __init__(self, device: torch.device, n: int) -> None:
        self.device, self.n = device, n
        self.a, self.b = _inputs(n, torch.float32, device, seed=4321)
        self.inputs = {"fp32": (self.a, self.b), "tf32": (self.a, self.b),
                       "bf16": (self.a.to(torch.bfloat16), self.b.to(torch.bfloat16))}
        self.first: dict[str, torch.Tensor] = {}
        self.first_sum: int | None = None
        self.reference: dict[str, Any] | None = None

    def _reference(self, c: torch.Tensor) -> dict[str, Any]:
        rows = max(1, min(self.n, int(HOST_REFERENCE_MACS // (self.n * self.n))))
        a, b = self.a[:rows].double().cpu(), self.b.double().cpu()
        ref = a @ b
        bound = a.abs() @ b.abs()
        k = self.n
        gamma = k * FP32_UNIT_ROUNDOFF / (1 - k * FP32_UNIT_ROUNDOFF)
        err = (c[:rows].double().cpu() - ref).abs()
        ratio = float((err / (gamma * bound).clamp_min(1e-300)).max().item())
        return {"rows": rows, "worst_share_of_bound": ratio, "ok": ratio <= 1.0}

    def _product(self, dtype: str) -> torch.Tensor:
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        a, b = self.inputs[dtype]
        return a @ b

    def run(self, iterations: int, faults: list[str]) -> dict[str, Any]:
        """``iterations`` rounds of one product per dtype; how many differed from the first (and in how many
        words), per dtype too."""
        wrong = {d: torch.zeros((), dtype=torch.int64, device=self.device) for d in CHECKED_DTYPES}
        words = torch.zeros((), dtype=torch.int64, device=self.device)
        last: torch.Tensor | None = None
        for _ in range(max(1, iterations)):
            for dtype in CHECKED_DTYPES:
                c = self._product(dtype)
                if "wrong_results" in faults:  # a simulated GPU's fault: its stand-in alters one element
                    c.view(-1)[0] += 1.0
                if dtype == "fp32":
                    last = c
                first = self.first.get(dtype)
                if first is None:
                    self.first[dtype] = c.clone()
                    if dtype == "fp32":
                        self.first_sum, self.reference = checksum(c), self._reference(c)
                    continue
                bits = _BITS[dtype]
                diff = (c.view(bits) != first.view(bits)).sum()
                words += diff
                wrong[dtype] += (diff > 0).to(torch.int64)
        _sync(self.device)
        last = self.first["fp32"] if last is None else last
        by = {d: int(v.item()) for d, v in wrong.items()}
        return {"iterations": max(1, iterations) * len(CHECKED_DTYPES), "wrong": sum(by.values()),
                "words": int(words.item()), "by_dtype": by,
                "checksum": checksum(last), "first": self.first_sum, "reference": self.reference, "n": self.n}


def serve(spec: dict[str, Any], lines: Any, out: Any) -> None:
    """The checked load stepped by its parent: one JSON request a line (``iterations``, each GPU's
    ``faults``), one JSON answer a line (each GPU's ``Checked.run``). A simulated workstation paces it with
    simulated time; the CPU stands in for each GPU (one ``Checked`` each, the same inputs)."""
    device = torch.device("cpu") if spec["device"] != "cuda" else torch.device("cuda", int(spec.get("cuda_index", 0)))
    checkers = {str(g): Checked(device, int(spec["gemm_n"])) for g in spec["gpus"]}
    for line in lines:
        req = json.loads(line)
        faults = req.get("faults") or {}
        answer = {g: c.run(int(req.get("iterations", 1)), list(faults.get(g, []))) for g, c in checkers.items()
                  if g in (req.get("gpus") or checkers)}
        out.write(json.dumps({"gpus": answer}) + "\n")
        out.flush()


def _size(path: str | None, n: int) -> int:
    """The matrix dimension the parent asks for now (targeted power's closed loop writes it), else ``n``."""
    if not path:
        return n
    try:
        with open(path) as f:
            return max(64, min(n, int(f.read().strip() or n)))
    except (OSError, ValueError):
        return n


def burn(device: torch.device, seconds: float, n: int, report: str | None = None,
         size: str | None = None) -> dict[str, Any]:
    """Sustained, checked GEMM load for ``seconds`` (the soak, targeted power and load steps hold it): each
    product compared with the first of its size (``Checked``); about once a second a line of what was checked
    since the last is appended to ``report`` (the parent reads it as it goes), and the matrix dimension is
    read again from ``size`` (at most ``n``): targeted power's closed loop sizes the load so."""
    checks: dict[int, Checked] = {}
    start, reps = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        dim = _size(size, n)
        check = checks.get(dim) or checks.setdefault(dim, Checked(device, dim))
        t = time.perf_counter()
        done: dict[str, Any] = {"iterations": 0, "wrong": 0, "words": 0, "n": dim, "by_dtype": {}}
        while time.perf_counter() - t < 1.0:
            more = check.run(8, [])
            for k in ("iterations", "wrong", "words"):
                done[k] += more[k]
            for d, v in more["by_dtype"].items():
                done["by_dtype"][d] = done["by_dtype"].get(d, 0) + v
            done.update(checksum=more["checksum"], first=more["first"], reference=more["reference"])
        reps += done["iterations"]
        if report:
            with open(report, "a") as f:
                f.write(json.dumps(done) + "\n")
    return {"seconds": time.perf_counter() - start, "products": reps}


def run_one(spec: dict[str, Any], index: int) -> dict[str, Any]:
    # On cuda the launcher shows the child its one GPU (CUDA_VISIBLE_DEVICES=UUID): CUDA index 0.
    device = (torch.device("cuda", int(spec.get("cuda_index", index))) if spec["device"] == "cuda"
              else torch.device("cpu"))
    _FAULTS["now"] = list((spec.get("faults") or {}).get(str(index), []))
    seconds = float(spec.get("seconds", 1.0))
    out: dict[str, Any] = {"device": spec["device"], "torch": torch.__version__}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out["name"], out["uuid"] = props.name, str(getattr(props, "uuid", "")) or None
    for task in spec["tasks"]:
        if task == "gemm":
            out["gemm"] = [gemm(device, d, int(spec["gemm_n"]), seconds) for d in spec.get("dtypes", DTYPES)]
        elif task == "device_bandwidth":
            out["device_bandwidth"] = device_bandwidth(device, int(spec["copy_mib"]), seconds)
        elif task == "host_bandwidth":
            out["host_bandwidth"] = host_bandwidth(device, int(spec["copy_mib"]), seconds)
        elif task == "memtest":
            out["memtest"] = memtest(device, int(spec["memtest_mib"]), float(spec.get("memtest_seconds", 0.0)),
                                     float(spec.get("memtest_fade_s", 0.0)), int(spec.get("memtest_seed", 0)))
        elif task == "burn":
            out["burn"] = burn(device, float(spec["burn_seconds"]), int(spec["gemm_n"]), spec.get("report"),
                               spec.get("size"))
        else:
            raise SystemExit(f"unknown task {task!r}")
    return out


def deterministic(device: str) -> None:
    """Deterministic kernels where a choice exists: on cuda (cuBLAS workspaces, atomics). On the CPU the switch
    changes nothing these tasks run: of the CPU operations PyTorch's documentation of
    ``torch.use_deterministic_algorithms`` lists, it affects only ``index_put``/``put_`` with ``accumulate``,
    the backward of indexing by tensors and the like, none of them here (matmul, copy, fill, comparisons,
    sums, slices); and it costs a CPU child 0.8 s importing the compiler's config, which it sets too. If
    the stand-ins' products differed bit for bit, ``test_burnin.py::test_quick_on_the_healthy_z8_passes_
    within_two_minutes`` would fail on the digests."""
    if device == "cuda":
        torch.use_deterministic_algorithms(True, warn_only=True)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Every GPU of ``spec["gpus"]`` in turn (on ``cuda`` one GPU per child, as the launcher starts them)."""
    torch.manual_seed(0)
    deterministic(spec["device"])
    if spec.get("cpus"):
        os.sched_setaffinity(0, spec["cpus"])
    return {"gpus": {str(g): run_one(spec, int(g)) for g in spec["gpus"]}}


def main(argv: list[str]) -> int:
    spec = json.loads(open(argv[0]).read())
    if spec.get("tasks") == ["serve"]:
        deterministic(spec["device"])
        if spec["device"] != "cuda":
            torch.set_num_threads(1)  # small products, one at a time: threads would only wait on each other
        serve(spec, sys.stdin, sys.stdout)
        return 0
    result = run(spec)
    tmp = spec["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, spec["out"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
