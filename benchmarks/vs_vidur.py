"""tokenpath against Vidur (microsoft/vidur), side by side on the same requests: wall time and
simulated requests per wall-second of each, and the ratio.

Usage:
  python benchmarks/vs_vidur.py --vidur-repo PATH [--repeats 3] [--cases 1x10000 8x50000]
                                [--rate 16] [--json PATH]

--vidur-repo is a checkout of github.com/microsoft/vidur, or a bare git directory of one (the script
reads `data/profiling/...` from its work tree, else from HEAD with `git show`). The script downloads
nothing but pip packages.

What runs:
- Vidur is installed from PyPI (vidur==0.0.26 by default) into a virtual environment under
  --cache-dir (default ~/.cache/tokenpath-bench/vidur-venv), made once and reused, and run as a
  subprocess: vidur.main's main() with the sarathi replica scheduler and the random-forest
  execution-time predictor, TP=1, one pipeline stage, round-robin routing, the requests replayed from a
  trace CSV (its trace_replay generator), --no-metrics_config_store_plots (plot export needs Chrome)
  and --no-metrics_config_enable_chrome_trace. Its per-request metrics stay on: they are its result.
  By default it uses its C++ execution-time predictor (use_native_execution_time_predictor: the same
  predictions, looked up faster; --no-vidur-native-predictor turns it off). After main() returns the
  subprocess prints how many batches (engine steps) Vidur simulated.
- tokenpath runs in this process: `simulate(prepare(load_scenario(...)))` on the same requests, replayed from an
  Azure-format trace written from the same arrays, with the same batch limits (max_num_seqs =
  sarathi batch_size_cap, max_num_batched_tokens = sarathi chunk_size; 128 and 512, Vidur's defaults).

Workload: the LLMPerf shape (input tokens normal(550, 150), output normal(150, 80)), Poisson arrivals
at --rate requests/s per replica, drawn once by tokenpath's workload generator (seed 0) and written to
both trace files under --work-dir, so both tools simulate identical requests. The default rate, 16/s
per replica, keeps Vidur's A100 replica busy (batches near the cap of 128, mean E2E several seconds)
but stable (it finishes within seconds of the last arrival); the table shows each tool's simulated end
time and mean E2E so the load can be checked.

Hardware: the Vidur repository holds Meta-Llama-3-8B MLP profiles for the A100 only, so both tools
simulate an A100 (--vidur-device a100; tokenpath's catalog a100). Each tool predicts its own step times,
so the step counts can differ: the table reports each (the steps column).

Profiles. Vidur 0.0.26 ships no profiles: its execution-time predictor fetches them from Hugging Face
dataset repositories at run time, which cannot work offline. The script lays them out as an offline
Hugging Face cache and runs Vidur with HF_HUB_OFFLINE=1:
- mlp.csv, all_reduce.csv and send_recv.csv come unchanged from the Vidur repository given by
  --vidur-repo (data/profiling/compute/<device>/meta-llama/Meta-Llama-3-8B/mlp.csv and
  data/profiling/network/<device>_dgx/*.csv).
- attention.csv is NOT Vidur's measured attention profile (those files are too large to obtain here).
  It is a roofline estimate (FLOPs and bytes of attention on the device, at fixed efficiencies) written on
  Vidur's own attention profiling grid (vidur.profiling.utils.get_attention_input_combinations:
  max_seq_len 4096, batch sizes 1-128, chunk sizes up to 4096, block size 16, TP 1/2/4/8). This
  changes the step times Vidur predicts, not how fast it simulates: Vidur turns every profile into
  prediction tables before the simulation starts, and each simulated step is table look-ups.
  These numbers are therefore a speed comparison, not an accuracy comparison.

Vidur's predictor: trained on first use and cached under --cache-dir; later runs load the cached
models and prediction tables. A setup run on 200 requests does the training (its setup time is
reported, and is predictor training when Vidur logs "Trained model") and is not among the timed
repeats. Vidur's default random-forest search (27 hyperparameter points, 10-fold cross-validation,
for each of its 12 models) took 10 minutes for its first model (456 training rows) on a 2-core
machine, hours in all; --vidur-rf-grid single (the default) searches one point of that grid (250 trees, depth 32,
min_samples_split 2), --vidur-rf-grid full the whole grid. The search only decides the predictor's
accuracy and setup time: the simulation itself looks predictions up in tables either way.
Its prediction tables span 1..4096 tokens per request (prediction_max_tokens_per_request = 4096, the
model's max_model_len in Vidur; its default of 2M only makes setup longer).

Timing: the script timestamps Vidur's log lines. Setup is process start until "Starting simulation"
(parsing its configuration, loading its predictor, reading the trace into request objects); "after
setup" is from there until "Metrics written" (the event loop and writing its results); "whole run" is
the process from start to exit. tokenpath is timed the same way, in this process after one untimed
warm-up call: setup is prepare() (building the deployment and reading the trace), "after setup" is
simulate() on what prepare() returned (the engine, delivery and per-request results), and "whole run"
is both. Medians of --repeats runs of Vidur and --tokenpath-repeats runs of tokenpath, the latter
spread over the former (a share after each Vidur run) so that both see the same stretches of a noisy
machine.

Processes: Vidur simulates every replica in one process. tokenpath is timed that way too (workers=1,
the "tokenpath" rows and ratios); for cases with several replicas it is also timed as it runs by
default, its replicas simulated side by side by one forked worker per CPU (the "tokenpath, N workers"
rows). Both results are identical, request by request.

If Vidur cannot be installed or run, the script says exactly why, prints Vidur's own error output,
and exits non-zero; it never reports numbers it did not measure.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import lzma
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenpath.sim.forked import available_cpus
from tokenpath.sim.scenario import load_scenario
from tokenpath.sim.simulate import prepare, simulate
from tokenpath.workload import generate, write_trace

VIDUR_MODEL = "meta-llama/Llama-3-8B"  # Vidur's name for the model
VIDUR_REPO_MODEL_DIR = "meta-llama/Meta-Llama-3-8B"  # its folder in the repository's profiling data
TOKENPATH_MODEL = "llama-3.1-8b"  # same architecture: 32 layers, 4096 wide, 32 q / 8 kv heads, MLP 14336
TOKENPATH_CHIP = "a100"

# Llama-3-8B attention shape.
N_EMBD, N_Q_HEAD, N_KV_HEAD = 4096, 32, 8
HEAD_DIM = N_EMBD // N_Q_HEAD
NUM_LAYERS = 32

# Roofline parameters for the attention table: dense BF16 peak and HBM bandwidth from the NVIDIA
# A100 80GB SXM and H100 SXM datasheets; fixed kernel efficiencies and a launch overhead.
DEVICES = {
    "a100": {"flops": 312e12, "bw_Bps": 2.039e12, "memory_bytes": 80 * 2**30},
    "h100": {"flops": 989e12, "bw_Bps": 3.35e12, "memory_bytes": 80 * 2**30},
}
ATTN_FLOP_EFFICIENCY = 0.6
ATTN_BW_EFFICIENCY = 0.8
KERNEL_OVERHEAD_MS = 0.008
BYTES_PER_ELEMENT = 2  # fp16 / bf16

# Vidur's attention profiling defaults (vidur/profiling/attention/main.py).
GRID_MAX_SEQ_LEN = 4096
GRID_MAX_CHUNK = 4096
GRID_MIN_BATCH, GRID_MAX_BATCH = 1, 128
GRID_BLOCK_SIZE = 16
GRID_TP = (1, 2, 4, 8)
GRID_GPU_MEMORY_UTILIZATION = 0.9
GRID_MAX_PIPELINE_STAGES = 8

# One point of Vidur's random-forest grid (its default grid: num_estimators 250/500/750, max_depth
# 8/16/32, min_samples_split 2/5/10, each point cross-validated 10-fold).
RF_SINGLE = {"num_estimators": 250, "max_depth": 32, "min_samples_split": 2}

TRACE_DATE = "2023-11-16"
SETUP_REQUESTS = 200
HUB_ORG = "tokenpath-bench"

REQUESTS_INPUT = {"kind": "normal", "mean": 550, "sd": 150}
REQUESTS_OUTPUT = {"kind": "normal", "mean": 150, "sd": 80}


class BenchError(Exception):
    """Vidur could not be set up or run; the message says why."""


# --------------------------------------------------------------------------------------------------
# Vidur's attention profiling grid (a re-statement of vidur.profiling.utils, which imports torch)


def _grid_seq_lengths(max_seq_len: int) -> list[int]:
    space = (
        list(range(0, 1024 + 1, 32))
        + list(range(1024, 4 * 1024 + 1, 64))
        + list(range(4 * 1024, 64 * 1024 + 1, 256))
    )
    out = []
    for n in space:
        if n >= max_seq_len:
            break
        out.append(n)
    return out


def _grid_chunk_sizes(max_seq_len: int, max_chunk: int) -> list[int]:
    space = list(range(32, 128 + 1, 32)) + list(range(256, 1024 + 1, 128)) + list(range(1024, 8 * 1024 + 1, 512))
    out = []
    for n in space:
        if n > max_seq_len or n > max_chunk:
            break
        out.append(n)
    return out


def attention_grid(max_seq_len: int = GRID_MAX_SEQ_LEN) -> list[tuple[int, int, int, bool]]:
    """(prefill_chunk_size, kv_cache_size, batch_size, is_prefill), valid points only, in Vidur's order."""
    points: list[tuple[int, int, int, bool]] = []
    for chunk in _grid_chunk_sizes(max_seq_len, GRID_MAX_CHUNK):
        points += [(chunk, i * chunk, 1, True) for i in range(max_seq_len // chunk)]
    if max_seq_len <= GRID_MAX_CHUNK:
        points += [(n, 0, 1, True) for n in _grid_seq_lengths(max_seq_len)]
    batches = [b for b in list(range(1, 129)) + list(range(128, 1025, 8)) if GRID_MIN_BATCH <= b <= GRID_MAX_BATCH]
    points += [(0, kv, b, False) for kv in _grid_seq_lengths(max_seq_len) for b in batches]

    def valid(p: tuple[int, int, int, bool]) -> bool:
        chunk, kv, batch, prefill = p
        if prefill:
            return batch == 1 and chunk > 0 and chunk + kv <= max_seq_len
        return chunk == 0 and 0 < kv <= max_seq_len

    return [p for p in points if valid(p)]


def roofline_attention_csv(device: str) -> bytes:
    """Attention times (ms per layer) on Vidur's grid, in the columns of its attention profile."""
    spec = DEVICES[device]
    flops_s = spec["flops"] * ATTN_FLOP_EFFICIENCY
    bw = spec["bw_Bps"] * ATTN_BW_EFFICIENCY
    grid = attention_grid()
    header = (
        "time_stats.attn_prefill.median,time_stats.attn_decode.median,time_stats.attn_kv_cache_save.median,"
        "n_embd,n_q_head,n_kv_head,block_size,num_tensor_parallel_workers,max_model_len,batch_size,"
        "prefill_chunk_size,kv_cache_size,is_prefill,attention_backend\n"
    )
    lines = [header]
    for tp in GRID_TP:
        q_heads = N_Q_HEAD // tp
        kv_heads = math.ceil(N_KV_HEAD / tp)
        kv_bytes_per_token = 2 * kv_heads * HEAD_DIM * BYTES_PER_ELEMENT  # K and V
        block_bytes = GRID_BLOCK_SIZE * kv_bytes_per_token * (NUM_LAYERS // GRID_MAX_PIPELINE_STAGES)
        max_tokens = math.floor(spec["memory_bytes"] * GRID_GPU_MEMORY_UTILIZATION / block_bytes) * GRID_BLOCK_SIZE
        for chunk, kv, batch, prefill in grid:
            if batch * (kv + chunk) > max_tokens:  # Vidur's is_under_memory_limit
                continue
            if prefill:
                flops = 4 * q_heads * HEAD_DIM * chunk * (kv + (chunk + 1) / 2)  # causal QK^T and PV
                moved = kv_bytes_per_token * (kv + chunk) + 2 * q_heads * HEAD_DIM * chunk * BYTES_PER_ELEMENT
                new_tokens = chunk
            else:
                flops = 4 * q_heads * HEAD_DIM * batch * kv
                moved = kv_bytes_per_token * batch * kv + 2 * q_heads * HEAD_DIM * batch * BYTES_PER_ELEMENT
                new_tokens = batch
            attn_ms = max(flops / flops_s, moved / bw) * 1e3 + KERNEL_OVERHEAD_MS
            save_ms = 2 * kv_bytes_per_token * new_tokens / bw * 1e3 + KERNEL_OVERHEAD_MS  # read + write
            prefill_ms = f"{attn_ms:.6f}" if prefill else ""
            decode_ms = "" if prefill else f"{attn_ms:.6f}"
            lines.append(
                f"{prefill_ms},{decode_ms},{save_ms:.6f},{N_EMBD},{N_Q_HEAD},{N_KV_HEAD},{GRID_BLOCK_SIZE},{tp},"
                f"{GRID_MAX_SEQ_LEN},{batch},{chunk},{kv},{prefill},roofline\n"
            )
    return "".join(lines).encode()


# --------------------------------------------------------------------------------------------------
# Vidur's profiling data as an offline Hugging Face cache


def _git_dir(repo: Path) -> Path | None:
    if (repo / "HEAD").is_file() and (repo / "objects").is_dir():
        return repo
    if (repo / ".git").exists():
        return repo / ".git"
    return None


def read_repo_file(repo: Path, rel: str) -> bytes:
    path = repo / rel
    if path.is_file():
        return path.read_bytes()
    git_dir = _git_dir(repo)
    if git_dir is None:
        raise BenchError(f"{repo} has no {rel} and is not a git repository; pass a checkout of microsoft/vidur")
    done = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"HEAD:{rel}"], capture_output=True)
    if done.returncode != 0 or not done.stdout:
        raise BenchError(
            f"the Vidur repository at {repo} has no {rel} (git: {done.stderr.decode().strip() or 'empty file'})"
        )
    return done.stdout


def _hub_snapshot(cache_dir: Path, repo_id: str, files: dict[str, bytes]) -> None:
    """Lay `files` out as a cached dataset snapshot, the way huggingface_hub's snapshot_download finds it
    offline: <cache>/datasets--<org>--<name>/refs/main holds a commit id, snapshots/<id>/ the files."""
    digest = hashlib.sha1()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    commit = digest.hexdigest()
    storage = cache_dir / ("datasets--" + repo_id.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        target = snapshot / name
        if not target.exists() or target.read_bytes() != data:
            target.write_bytes(data)
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / "main").write_text(commit)


@dataclass
class VidurData:
    predictor_cache: Path
    compute_dataset: str
    network_dataset: str
    sources: dict[str, str]


def prepare_vidur_data(vidur_repo: Path, device: str, cache_root: Path, rf_grid: str) -> VidurData:
    if device not in DEVICES:
        raise BenchError(f"--vidur-device {device!r}: the roofline attention table knows {', '.join(DEVICES)}")
    network_device = f"{device}_dgx"
    mlp_rel = f"data/profiling/compute/{device}/{VIDUR_REPO_MODEL_DIR}/mlp.csv"
    net_rel = f"data/profiling/network/{network_device}"
    mlp = read_repo_file(vidur_repo, mlp_rel)
    all_reduce = read_repo_file(vidur_repo, f"{net_rel}/all_reduce.csv")
    send_recv = read_repo_file(vidur_repo, f"{net_rel}/send_recv.csv")
    attention = roofline_attention_csv(device)

    def xz(data: bytes) -> bytes:
        return lzma.compress(data, preset=1)

    # Dataset names carry a content hash: Vidur keys its cached models by dataset name, so a changed
    # profile gets freshly trained models.
    compute_hash = hashlib.sha1(mlp + attention).hexdigest()[:10]
    network_hash = hashlib.sha1(all_reduce + send_recv).hexdigest()[:10]
    compute_dataset = f"{HUB_ORG}/llama-3-8b-{device}-{compute_hash}"
    network_dataset = f"{HUB_ORG}/{network_device}-{network_hash}"
    # Vidur's model cache key leaves out the random-forest grid, so each grid gets its own cache.
    predictor_cache = cache_root / f"vidur-cache-{rf_grid}-grid"
    _hub_snapshot(
        predictor_cache / "profiling_data" / "compute",
        compute_dataset,
        {
            "config.json": json.dumps({"model": VIDUR_MODEL, "device_sku": device}).encode(),
            "mlp.csv.xz": xz(mlp),
            "attention.csv.xz": xz(attention),
        },
    )
    _hub_snapshot(
        predictor_cache / "profiling_data" / "network",
        network_dataset,
        {
            "config.json": json.dumps({"sku": network_device}).encode(),
            "all_reduce.csv.xz": xz(all_reduce),
            "send_recv.csv.xz": xz(send_recv),
        },
    )
    sources = {
        "mlp": f"vidur repository {mlp_rel}",
        "all_reduce": f"vidur repository {net_rel}/all_reduce.csv",
        "send_recv": f"vidur repository {net_rel}/send_recv.csv",
        "attention": f"roofline estimate on Vidur's attention grid ({device}: "
        f"{ATTN_FLOP_EFFICIENCY:.0%} of {DEVICES[device]['flops'] / 1e12:.0f} TFLOP/s, "
        f"{ATTN_BW_EFFICIENCY:.0%} of {DEVICES[device]['bw_Bps'] / 1e12:.2f} TB/s, +{KERNEL_OVERHEAD_MS * 1e3:.0f} us)",
    }
    return VidurData(predictor_cache, compute_dataset, network_dataset, sources)


# --------------------------------------------------------------------------------------------------
# Vidur's virtual environment


def ensure_venv(venv: Path, version: str) -> Path:
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import importlib.metadata as m, vidur.main; print(m.version('vidur'))"]
    if python.exists():
        done = subprocess.run(probe, capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == version:
            return python
    print(f"installing vidur=={version} into {venv} (once) ...", flush=True)
    if not python.exists():
        done = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if done.returncode != 0:
            raise BenchError(f"cannot create a virtual environment at {venv}:\n{done.stdout}{done.stderr}")
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", f"vidur=={version}"],
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise BenchError(f"pip install vidur=={version} failed:\n{done.stdout}{done.stderr}")
    done = subprocess.run(probe, capture_output=True, text=True)
    if done.returncode != 0 or done.stdout.strip() != version:
        raise BenchError(f"vidur=={version} was installed but does not import:\n{done.stdout}{done.stderr}")
    return python


# --------------------------------------------------------------------------------------------------
# The shared workload


@dataclass
class Case:
    replicas: int
    num_requests: int

    @property
    def name(self) -> str:
        return f"{self.replicas}x{self.num_requests}"


@dataclass
class Workload:
    case: Case
    rate: float  # requests/s over the whole deployment
    azure_trace: Path
    vidur_trace: Path
    last_arrival_s: float
    mean_input: float
    mean_output: float


def make_workload(case: Case, rate_per_replica: float, work_dir: Path, seed: int) -> Workload:
    rate = rate_per_replica * case.replicas
    scenario = load_scenario(
        "typical",
        {
            "workload.num_requests": case.num_requests,
            "workload.arrival.rate": rate,
            "workload.arrival.burstiness": 1.0,
            "workload.input": dict(REQUESTS_INPUT),
            "workload.output": dict(REQUESTS_OUTPUT),
        },
    )
    requests = generate(scenario.workload, np.random.default_rng(seed))
    stem = f"requests_{case.name}_rate{rate:g}_seed{seed}"
    azure = work_dir / f"{stem}_azure.csv"
    write_trace(requests, azure, "azure")
    vidur = work_dir / f"{stem}_vidur.csv"
    with open(vidur, "w") as out:
        out.write("Date,Time,PromptTokenCount,CompletionTokenCount\n")
        rows = zip(requests.arrival_s.tolist(), requests.input_tokens.tolist(), requests.output_tokens.tolist())
        for t, i, o in rows:
            out.write(f"{TRACE_DATE},{t!r},{i},{o}\n")
    return Workload(
        case, rate, azure, vidur, float(requests.arrival_s[-1]),
        float(requests.input_tokens.mean()), float(requests.output_tokens.mean()),
    )


# --------------------------------------------------------------------------------------------------
# Runs


@dataclass
class VidurRun:
    wall_s: float
    setup_s: float
    sim_s: float  # "Starting simulation" until "Metrics written": the event loop and writing its results
    loop_s: float  # "Starting simulation" until "Simulation ended": the event loop
    exit_s: float  # after "Metrics written" until the process has exited
    trained: bool
    simulated_end_s: float | None
    completed: int | None
    mean_e2e_s: float | None
    batches: int | None
    log: str


_ENDED = re.compile(r"Simulation ended at: ([0-9.eE+-]+)s")
_BATCHES = re.compile(r"^vidur-bench batches: (\d+)$")
# vidur.main's main(), then the number of batches (engine steps) it simulated: Batch ids count up from 0.
VIDUR_MAIN = (
    "from vidur.main import main\n"
    "from vidur.entities.batch import Batch\n"
    "main()\n"
    "print(f'vidur-bench batches: {Batch._id + 1}', flush=True)\n"
)


def run_vidur(
    python: Path, data: VidurData, wl: Workload, args: argparse.Namespace, out_dir: Path, tag: str
) -> VidurRun:
    p = "random_forrest_execution_time_predictor_config"
    cmd = [
        str(python), "-u", "-c", VIDUR_MAIN,
        "--seed", "42",
        "--cluster_config_num_replicas", str(wl.case.replicas),
        "--replica_config_model_name", VIDUR_MODEL,
        "--replica_config_device", args.vidur_device,
        "--replica_config_network_device", f"{args.vidur_device}_dgx",
        "--replica_config_tensor_parallel_size", "1",
        "--replica_config_num_pipeline_stages", "1",
        "--global_scheduler_config_type", "round_robin",
        "--replica_scheduler_config_type", "sarathi",
        "--sarathi_scheduler_config_batch_size_cap", str(args.batch_cap),
        "--sarathi_scheduler_config_chunk_size", str(args.chunk_size),
        "--request_generator_config_type", "trace_replay",
        "--trace_request_generator_config_trace_file", str(wl.vidur_trace),
        "--trace_request_generator_config_date", TRACE_DATE,
        "--trace_request_generator_config_prefill_scale_factor", "1",
        "--trace_request_generator_config_decode_scale_factor", "1",
        "--trace_request_generator_config_time_scale_factor", "1",
        "--trace_request_generator_config_max_tokens", str(GRID_MAX_SEQ_LEN),
        "--execution_time_predictor_config_type", "random_forrest",
        f"--{p}_model_profiling_dataset", data.compute_dataset,
        f"--{p}_network_profiling_dataset", data.network_dataset,
        f"--{p}_cache_dir", str(data.predictor_cache),
        f"--{p}_prediction_max_tokens_per_request", str(GRID_MAX_SEQ_LEN),
        "--no-metrics_config_store_plots",
        "--no-metrics_config_enable_chrome_trace",
        "--metrics_config_output_dir", str(out_dir / "simulator_output"),
    ]
    if args.vidur_rf_grid == "single":
        cmd += [f"--{p}_num_estimators", str(RF_SINGLE["num_estimators"]),
                f"--{p}_max_depth", str(RF_SINGLE["max_depth"]),
                f"--{p}_min_samples_split", str(RF_SINGLE["min_samples_split"])]
    if args.vidur_native_predictor:
        cmd.append(f"--{p}_use_native_execution_time_predictor")
    else:
        cmd.append(f"--no-{p}_use_native_execution_time_predictor")
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", WANDB_MODE="disabled", WANDB_SILENT="true",
               PYTHONUNBUFFERED="1")
    out_dir.mkdir(parents=True, exist_ok=True)
    log_lines: list[str] = []
    t_start = t_ended = t_written = None
    batches = None
    trained = False
    simulated_end = None
    t0 = time.perf_counter()
    log_path = out_dir / f"vidur_{tag}.log"
    log_file = open(log_path, "w")
    log_file.write(" ".join(cmd) + "\n\n")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=out_dir, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.perf_counter()
        log_lines.append(line)
        log_file.write(line)
        log_file.flush()
        if t_start is None and "Starting simulation" in line:
            t_start = now
        elif "Trained model" in line:
            trained = True
        if t_written is None and "Metrics written" in line:
            t_written = now
        m = _BATCHES.match(line.strip())
        if m:
            batches = int(m.group(1))
        m = _ENDED.search(line)
        if m:
            t_ended = now
            simulated_end = float(m.group(1))
    rc = proc.wait()
    t_exit = time.perf_counter()
    log_file.close()
    log = "".join(log_lines)
    if rc != 0 or t_start is None or t_ended is None:
        raise BenchError(
            f"Vidur exited with status {rc} on case {wl.case.name} "
            f"({'it never started simulating' if t_start is None else 'the simulation did not finish'}).\n"
            f"command: {' '.join(cmd)}\n--- Vidur output ---\n{log}"
        )
    completed, mean_e2e = None, None
    metrics = sorted((out_dir / "simulator_output").glob("*/request_metrics.csv"), key=os.path.getmtime)
    if metrics:
        with open(metrics[-1], newline="") as f:
            e2e = [float(row["request_e2e_time"]) for row in csv.DictReader(f)]
        completed, mean_e2e = len(e2e), (sum(e2e) / len(e2e) if e2e else None)
    return VidurRun(
        wall_s=t_exit - t0, setup_s=t_start - t0, sim_s=(t_written or t_exit) - t_start, loop_s=t_ended - t_start,
        exit_s=t_exit - (t_written or t_exit),
        trained=trained, simulated_end_s=simulated_end, completed=completed, mean_e2e_s=mean_e2e, batches=batches,
        log=log,
    )


@dataclass
class TokenpathRun:
    setup_s: float  # prepare(): the deployment (compute model, fabric, KV capacity) and the trace's requests
    sim_s: float  # simulate(): the engine, the last mile and the per-request results
    simulated_end_s: float
    steps: int
    completed: int
    mean_e2e_s: float


def tokenpath_scenario(wl: Workload, args: argparse.Namespace):
    return load_scenario(
        "typical",
        {
            "model.name": TOKENPATH_MODEL,
            "model.precision": "bf16",
            "deployment.chip": TOKENPATH_CHIP,
            "deployment.chips": wl.case.replicas,
            "deployment.tp": 1,
            "engine.max_num_seqs": args.batch_cap,
            "engine.max_num_batched_tokens": args.chunk_size,
            "workload.num_requests": wl.case.num_requests,
            "workload.trace": {"path": str(wl.azure_trace), "format": "azure"},
        },
    )


def run_tokenpath(wl: Workload, args: argparse.Namespace, workers: int) -> TokenpathRun:
    scenario = tokenpath_scenario(wl, args)
    start = time.perf_counter()
    prepared = prepare(scenario)
    ready = time.perf_counter()
    sim = simulate(prepared, workers=workers)
    end = time.perf_counter()
    run = sim.run
    return TokenpathRun(
        setup_s=ready - start,
        sim_s=end - ready,
        simulated_end_s=float((run.sent_ns + run.e2e_ns).max() / 1e9),
        steps=int(sum(len(t.step_start_ns) for t in sim.traces)),
        completed=int(len(run.e2e_ns) - np.count_nonzero(run.failed)),
        mean_e2e_s=float(run.e2e_ns.mean() / 1e9),
    )


# --------------------------------------------------------------------------------------------------


def parse_case(text: str) -> Case:
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: a case is REPLICASxREQUESTS, e.g. 1x10000")
    return Case(int(m.group(1)), int(m.group(2)))


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def summarize_tokenpath(case: Case, tp_runs: list[TokenpathRun], workers: int) -> dict:
    t_sim = median([r.sim_s for r in tp_runs])
    t_wall = median([r.setup_s + r.sim_s for r in tp_runs])
    t0 = tp_runs[0]
    return {
        "workers": workers,
        "wall_s_median": t_wall,
        "setup_s_median": median([r.setup_s for r in tp_runs]),
        "sim_s_median": t_sim,
        "sim_s_all": [r.sim_s for r in tp_runs],
        **_outcome(case, t_sim, t_wall, t0.steps, t0.simulated_end_s, t0.completed, t0.mean_e2e_s),
    }


def _outcome(case: Case, sim_s: float, wall_s: float, steps: int | None, simulated_end_s: float | None,
             completed: int | None, mean_e2e_s: float | None) -> dict:
    """What both tools report alike: requests per wall-second, and the first run's simulated outcome."""
    return {
        "requests_per_wall_s_after_setup": case.num_requests / sim_s,
        "requests_per_wall_s_total": case.num_requests / wall_s,
        "steps": steps,
        "simulated_end_s": simulated_end_s,
        "completed": completed,
        "mean_e2e_s": mean_e2e_s,
    }


def summarize(
    case: Case, wl: Workload, first: VidurRun, vidur_runs: list[VidurRun], tp_runs: dict[int, list[TokenpathRun]]
) -> dict:
    v_sim = median([r.sim_s for r in vidur_runs])
    v_wall = median([r.wall_s for r in vidur_runs])
    v_setup = median([r.setup_s for r in vidur_runs])
    v0 = vidur_runs[0]
    tokenpath = {workers: summarize_tokenpath(case, runs, workers) for workers, runs in tp_runs.items()}
    return {
        "case": case.name,
        "replicas": case.replicas,
        "num_requests": case.num_requests,
        "rate_rps": wl.rate,
        "last_arrival_s": wl.last_arrival_s,
        "mean_input_tokens": wl.mean_input,
        "mean_output_tokens": wl.mean_output,
        "vidur": {
            "setup_run": {"setup_s": first.setup_s, "sim_s": first.sim_s, "trained_predictor": first.trained},
            "wall_s_median": v_wall,
            "setup_s_median": v_setup,
            "sim_s_median": v_sim,
            "loop_s_median": median([r.loop_s for r in vidur_runs]),
            "exit_s_median": median([r.exit_s for r in vidur_runs]),
            "wall_s_all": [r.wall_s for r in vidur_runs],
            "setup_s_all": [r.setup_s for r in vidur_runs],
            "sim_s_all": [r.sim_s for r in vidur_runs],
            **_outcome(case, v_sim, v_wall, v0.batches, v0.simulated_end_s, v0.completed, v0.mean_e2e_s),
        },
        # One entry per process count, the first one process (as Vidur); ratios are Vidur's time / tokenpath's.
        "tokenpath": list(tokenpath.values()),
        "ratio_after_setup": {workers: v_sim / t["sim_s_median"] for workers, t in tokenpath.items()},
        "ratio_total": {workers: v_wall / t["wall_s_median"] for workers, t in tokenpath.items()},
    }


def print_table(results: list[dict]) -> None:
    def fmt(x: float | int | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    print()
    print(f"{'tool':<34} {'case':<11} {'requests':>8} {'rate':>7} {'median wall':>11} {'req/wall-s':>10} "
          f"{'steps':>8} {'sim. end':>8} {'mean E2E':>8}")
    for r in results:
        case = f"{r['replicas']} replica{'s' if r['replicas'] > 1 else ''}"
        v = r["vidur"]
        rows = [
            ("vidur, after setup", v["sim_s_median"], v["requests_per_wall_s_after_setup"], v),
            ("vidur, whole run", v["wall_s_median"], v["requests_per_wall_s_total"], v),
        ]
        for t in r["tokenpath"]:
            tool = "tokenpath" if t["workers"] == 1 else f"tokenpath, {t['workers']} workers"
            rows += [(f"{tool}, after setup", t["sim_s_median"], t["requests_per_wall_s_after_setup"], t),
                     (f"{tool}, whole run", t["wall_s_median"], t["requests_per_wall_s_total"], t)]
        for tool, wall, rps, d in rows:
            print(f"{tool:<34} {case:<11} {r['num_requests']:>8,} {r['rate_rps']:>5g}/s {wall:>10.2f}s {rps:>10,.0f} "
                  f"{fmt(d['steps'], ',d'):>8} {fmt(d['simulated_end_s'], '.0f'):>7}s "
                  f"{fmt(d['mean_e2e_s'], '.2f'):>7}s")
    print()
    for r in results:
        v = r["vidur"]
        for t in r["tokenpath"]:
            workers = t["workers"]
            how = "in one process" if workers == 1 else f"with {workers} workers"
            print(f"{r['case']}: tokenpath {how} is {r['ratio_after_setup'][workers]:.1f}x Vidur's speed after setup "
                  f"(each tool's), {r['ratio_total'][workers]:.1f}x over the whole run (setup: tokenpath "
                  f"{t['setup_s_median']:.2f}s; Vidur {v['setup_s_median']:.1f}s with a cached predictor; "
                  f"setup run {v['setup_run']['setup_s']:.1f}s"
                  f"{', training its predictor' if v['setup_run']['trained_predictor'] else ''}). "
                  f"Last arrival at {r['last_arrival_s']:.0f}s.")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vidur-repo", type=Path, required=True, help="checkout (or bare git dir) of microsoft/vidur")
    parser.add_argument("--vidur-version", default="0.0.26")
    parser.add_argument("--vidur-device", default="a100",
                        help="device Vidur simulates (its repository profiles Llama-3-8B on a100 only)")
    parser.add_argument("--vidur-rf-grid", choices=("single", "full"), default="single",
                        help="random-forest hyperparameters Vidur's grid search tries when it trains its predictor: "
                             "'full' is its default 27-point grid, 'single' one point of it (see the docstring)")
    parser.add_argument("--vidur-native-predictor", action=argparse.BooleanOptionalAction, default=True,
                        help="use Vidur's C++ execution-time predictor (use_native_execution_time_predictor): the "
                             "same predictions, looked up faster")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "tokenpath-bench")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/vidur-bench"))
    parser.add_argument("--cases", type=parse_case, nargs="+", default=[Case(1, 10_000), Case(8, 50_000)])
    parser.add_argument("--rate", type=float, default=16.0, help="Poisson arrival rate per replica, requests/s")
    parser.add_argument("--batch-cap", type=int, default=128, help="sarathi batch_size_cap = tokenpath max_num_seqs")
    parser.add_argument("--chunk-size", type=int, default=512,
                        help="sarathi chunk_size = tokenpath max_num_batched_tokens")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of Vidur per case")
    parser.add_argument("--tokenpath-repeats", type=int, default=15,
                        help="timed runs of tokenpath per case, spread over Vidur's runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_path", type=Path)
    args = parser.parse_args()

    args.work_dir.mkdir(parents=True, exist_ok=True)
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    try:
        python = ensure_venv(args.cache_dir / "vidur-venv", args.vidur_version)
        data = prepare_vidur_data(args.vidur_repo.expanduser().resolve(), args.vidur_device, args.cache_dir,
                                  args.vidur_rf_grid)
    except BenchError as error:
        print(f"Vidur cannot be run: {error}", file=sys.stderr)
        return 1

    print(f"Vidur {args.vidur_version}: {VIDUR_MODEL} on one {args.vidur_device} per replica, TP1, sarathi "
          f"(batch cap {args.batch_cap}, chunk {args.chunk_size}), random-forest predictor")
    for name, source in data.sources.items():
        print(f"  {name:>10}: {source}")
    print(f"tokenpath: {TOKENPATH_MODEL} bf16 on one {TOKENPATH_CHIP} per replica, TP1, max_num_seqs {args.batch_cap}, "
          f"max_num_batched_tokens {args.chunk_size}")
    print(f"workload: input normal(550, 150), output normal(150, 80), Poisson {args.rate:g} requests/s per replica, "
          f"seed {args.seed}; the same trace for both; {args.repeats} timed repeats each, medians\n", flush=True)

    try:
        # Setup run: trains Vidur's predictor (or loads it from the cache); not timed with the repeats.
        setup_wl = make_workload(Case(1, SETUP_REQUESTS), args.rate, args.work_dir, args.seed)
        first = run_vidur(python, data, setup_wl, args, args.work_dir / "vidur_setup", "setup")
    except BenchError as error:
        print(f"Vidur cannot be run: {error}", file=sys.stderr)
        return 1
    print(f"vidur setup run ({SETUP_REQUESTS} requests): setup {first.setup_s:.1f}s"
          f"{' (trained its predictor)' if first.trained else ' (predictor from cache)'}", flush=True)

    results = []
    for case in args.cases:
        wl = make_workload(case, args.rate, args.work_dir, args.seed)
        case_dir = args.work_dir / f"vidur_{case.name}"
        # One process as Vidur; and, with several replicas, one worker per CPU as tokenpath runs by default.
        worker_counts = [1] + ([min(case.replicas, available_cpus())]
                               if min(case.replicas, available_cpus()) > 1 else [])
        run_tokenpath(wl, args, 1)  # warm-up: imports, caches
        # Each Vidur run is followed by its share of tokenpath's runs, so that both tools' medians
        # come from the same stretches of a noisy machine.
        per_round = math.ceil(args.tokenpath_repeats / args.repeats)
        vidur_runs, tp_runs = [], {workers: [] for workers in worker_counts}
        for k in range(args.repeats):
            try:
                r = run_vidur(python, data, wl, args, case_dir, f"repeat{k}")
            except BenchError as error:
                print(f"Vidur cannot be run: {error}", file=sys.stderr)
                return 1
            vidur_runs.append(r)
            print(f"[{case.name}] vidur repeat {k + 1}: total {r.wall_s:.1f}s, setup {r.setup_s:.1f}s, "
                  f"simulation {r.sim_s:.1f}s (event loop {r.loop_s:.1f}s)", flush=True)
            for _ in range(min(per_round, args.tokenpath_repeats - len(tp_runs[1]))):
                for workers, runs in tp_runs.items():
                    t = run_tokenpath(wl, args, workers)
                    runs.append(t)
                    print(f"[{case.name}] tokenpath ({workers} process{'es' if workers > 1 else ''}) repeat "
                          f"{len(runs)}: setup {t.setup_s:.2f}s, simulation {t.sim_s:.2f}s", flush=True)
        results.append(summarize(case, wl, first, vidur_runs, tp_runs))

    print_table(results)

    if args.json_path:
        doc = {
            "benchmark": "vs_vidur",
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "vidur_version": args.vidur_version,
            "vidur_device": args.vidur_device,
            "vidur_native_predictor": args.vidur_native_predictor,
            "vidur_profiles": data.sources,
            "tokenpath_chip": TOKENPATH_CHIP,
            "batch_cap": args.batch_cap,
            "chunk_size": args.chunk_size,
            "repeats": args.repeats,
            "rate_per_replica_rps": args.rate,
            "results": results,
        }
        args.json_path.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
