"""tokenpath sweep: a grid of full simulations into a table, kept point by point, resumed, on Ray too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath import load_scenario, simulate
from tokenpath.config.errors import UserError
from tokenpath.sim.document import result_document
from tokenpath.sweep.pareto import frontier, parse_objectives
from tokenpath.sweep.point import axis_columns, flatten_summary
from tokenpath.sweep.run import _in_order, join_ray, run_sweep
from tokenpath.sweep.spec import load_spec, point_id

SPEC = """
scenario = "typical"
[overrides]
"workload.num_requests" = 150
[axes]
"workload.arrival.rate" = [5.0, 10.0, 20.0]
delivery.stream_interval = [1, 4]
"""


def _spec(tmp_path: Path, text: str = SPEC) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


def _by_point(rows):
    return {row["point"]: row for row in rows}


def test_grid_of_two_axes_writes_one_row_per_point(tmp_path):
    spec = load_spec(_spec(tmp_path))
    out = tmp_path / "r.parquet"
    result = run_sweep(spec, out, workers=2)
    rows = pq.read_table(out).to_pylist()
    assert (result.ran, result.already, len(rows)) == (6, 0, 6)
    assert sorted((r["workload.arrival.rate"], r["delivery.stream_interval"]) for r in rows) == \
        sorted((rate, k) for rate in (5.0, 10.0, 20.0) for k in (1, 4))
    # A row is the summary `simulate` gives for that point, flattened.
    row = next(r for r in rows if r["workload.arrival.rate"] == 10.0 and r["delivery.stream_interval"] == 4)
    scenario = load_scenario(None, {"workload.num_requests": 150, "workload.arrival.rate": 10.0,
                                    "delivery.stream_interval": 4})
    expected = flatten_summary(result_document(simulate(scenario))[0])
    assert row["latency_s.ttft.p99"] == expected["latency_s.ttft.p99"]
    assert row["continuity.qoe.mean"] == expected["continuity.qoe.mean"]
    assert {key: row[key] for key in expected} == expected
    assert row["point"] == point_id({"workload.arrival.rate": 10.0, "delivery.stream_interval": 4})


def test_a_stopped_sweep_resumes_with_the_missing_points_only(tmp_path):
    spec = load_spec(_spec(tmp_path))
    out = tmp_path / "r.csv"
    seen = []

    def stop_after_three(row):
        seen.append(row["point"])
        if len(seen) == 3:
            raise KeyboardInterrupt  # as Ctrl-C would, between points

    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, out, workers=1, finished=stop_after_three)
    first = pacsv.read_csv(out).to_pylist()
    assert sorted(r["point"] for r in first) == sorted(seen)

    ran = []
    result = run_sweep(spec, out, workers=1, finished=lambda row: ran.append(row["point"]))
    assert (result.already, result.ran) == (3, 3)
    assert not set(ran) & set(seen)
    rows = pacsv.read_csv(out).to_pylist()
    assert sorted(r["point"] for r in rows) == sorted(point_id(p) for p in spec.points)
    # The resumed table equals one run straight through.
    straight = tmp_path / "straight.csv"
    run_sweep(spec, straight, workers=1)
    assert _by_point(rows) == _by_point(pacsv.read_csv(straight).to_pylist())


def test_the_table_alone_is_enough_to_resume(tmp_path):
    spec = load_spec(_spec(tmp_path))
    out = tmp_path / "r.parquet"
    run_sweep(spec, out, workers=2)
    for part in (tmp_path / ".r.parquet.sweep").iterdir():
        part.unlink()
    (tmp_path / ".r.parquet.sweep").rmdir()
    result = run_sweep(spec, out, workers=1)
    assert (result.already, result.ran) == (6, 0)


def test_another_base_scenario_against_the_same_table_is_an_error(tmp_path):
    out = tmp_path / "r.parquet"
    run_sweep(load_spec(_spec(tmp_path)), out, workers=2)
    changed = load_spec(_spec(tmp_path, SPEC.replace("= 150", "= 160")))
    with pytest.raises(UserError, match="another base scenario"):
        run_sweep(changed, out)


def test_ranges_draw_samples_from_a_seed(tmp_path):
    text = """
scenario = "typical"
samples = 4
seed = 7
[axes]
"workload.arrival.rate" = {min = 1.0, max = 100.0, log = true}
"workload.num_requests" = {min = 50, max = 80}
"delivery.stream_interval" = [1, 2]
"""
    spec = load_spec(_spec(tmp_path, text))
    assert len(spec.points) == 8
    assert all(1.0 <= p["workload.arrival.rate"] <= 100.0 for p in spec.points)
    assert all(isinstance(p["workload.num_requests"], int) and 50 <= p["workload.num_requests"] <= 80
               for p in spec.points)
    assert load_spec(_spec(tmp_path, text)).points == spec.points
    assert load_spec(_spec(tmp_path, text.replace("seed = 7", "seed = 8"))).points != spec.points


@settings(max_examples=15, deadline=None)
@given(low=st.integers(1, 10**6), width=st.integers(1, 10**6), samples=st.integers(1, 20),
       log=st.booleans(), seed=st.integers(0, 2**32))
def test_integer_ranges_stay_inside(tmp_path_factory, low, width, samples, log, seed):
    folder = tmp_path_factory.mktemp("r")
    spec = load_spec(_spec(folder, f"""
scenario = "typical"
samples = {samples}
seed = {seed}
[axes]
"workload.num_requests" = {{min = {low}, max = {low + width}, log = {str(log).lower()}}}
"""))
    values = [p["workload.num_requests"] for p in spec.points]
    assert all(low <= v <= low + width for v in values)
    assert len(values) == len(set(values)) and 1 <= len(values) <= samples  # a repeated draw runs once


@pytest.mark.parametrize("text, message", [
    ('scenario = "typical"\nsample = 3\n[axes]\n"seed" = [1, 2]', "unknown key(s) 'sample'"),
    ('[axes]\n"seed" = [1, 2]', "scenario = NAME or FILE is required"),
    ('scenario = "typical"\n[axes]\n"deployment.tp" = []', "axes.deployment.tp: an empty list"),
    ('scenario = "typical"\n[axes]\n"deployment.tp" = {min = 4}', "a range needs numbers min < max"),
    ('scenario = "typical"\n[axes]\n"deployment.tp" = {min = 1, max = 8}', "samples = N"),
    # a range with a key ranges do not have: named, not read as axes "deployment.tp.min", ".max", ".step"
    ('scenario = "typical"\nsamples = 2\n[axes]\n"workload.arrival.rate" = {min = 1, max = 5, step = 1}',
     "axes.workload.arrival.rate: a range has min, max and optionally log, got max, min, step"),
    ('scenario = "typical"\n[axes]\n"deployment.tpp" = [1, 2]', "tpp"),
    # a seed with list axes alone draws nothing (and a bad one was numpy's traceback)
    ('scenario = "typical"\nseed = 5\n[axes]\n"deployment.tp" = [4, 8]',
     "seed seeds the draws of range axes, and every axis here is a list; remove it (the simulations' seed is the "
     "scenario's: overrides = { seed = N })"),
    ('scenario = "typical"\nseed = "abc"\n[axes]\n"deployment.tp" = [4, 8]', "seed seeds the draws of range axes"),
    ('scenario = "typical"\nsamples = 2\nseed = -1\n[axes]\n"workload.arrival.rate" = {min = 1, max = 5}',
     "seed must be an integer >= 0, got -1"),
    ('scenario = "typical"\n[axes]\n"workload.arrival.rate" = [10, 10.0]', "an axis lists a value twice"),
    ('scenario = "typical"\n[axes]\n"deployment" = [{tp = 4}, {tp = 8}]',
     "axes.deployment: {'tp': 4} is not a number, string or boolean; an axis's values are one column of the "
     "results; sweep a key inside it instead, e.g. axes.\"deployment.tp\" = [...]"),
    ('scenario = "typical"\n[axes]\n"deployment.tp" = [[4], [8]]', "axes.deployment.tp: [4] is not a number"),
    ('scenario = "typical"\n[overrides]\n"deployment.tp" = 2\n[axes]\n"deployment.tp" = [4, 8]',
     "deployment.tp is both an override and an axis; keep one"),
    ('scenario = "typical"\n[overrides]\ndeployment = {tp = 2}\n[axes]\n"deployment.tp" = {min = 1, max = 8}',
     "deployment.tp is both an override and an axis; keep one"),
])
def test_bad_specs_are_one_line_errors(tmp_path, text, message):
    path = _spec(tmp_path, text)
    with pytest.raises(UserError) as error:
        load_spec(path)
    assert message in str(error.value) and "\n" not in str(error.value)
    if "unknown key" not in message:
        return
    # and through the command line: one line, exit status 2
    done = subprocess.run([sys.executable, "-m", "tokenpath", "sweep", str(path), "--out", str(tmp_path / "o.parquet")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def _no_draws(monkeypatch):
    def refuse(*args):
        raise AssertionError("ranges drawn")

    monkeypatch.setattr("tokenpath.sweep.spec._range_values", refuse)


def test_too_many_samples_are_refused_before_any_is_drawn(tmp_path, monkeypatch):
    # Drawing first held 1.08 GB for 5,000,000 samples before the count was checked.
    _no_draws(monkeypatch)
    path = _spec(tmp_path, 'scenario = "typical"\nsamples = 2000000\n[axes]\n"deployment.tp" = [4, 8]\n'
                           '"workload.arrival.rate" = {min = 1.0, max = 9.0}')
    with pytest.raises(UserError) as caught:
        load_spec(path)
    assert str(caught.value) == (f"{path}: samples = 2,000,000 with 2 combinations of the listed values makes "
                                 "4,000,000 points, more than 1,000,000; lower samples")


def test_samples_beyond_memory_are_refused_naming_samples(tmp_path, monkeypatch):
    from tokenpath.config import memory

    _no_draws(monkeypatch)
    monkeypatch.setattr(memory, "available_bytes", lambda: memory.GIB)
    path = _spec(tmp_path, 'scenario = "typical"\nsamples = 100000\n[axes]\n'
                           '"workload.arrival.rate" = {min = 1.0, max = 9.0}')
    with pytest.raises(UserError) as caught:
        load_spec(path)
    assert str(caught.value) == (f"{path}: samples = 100,000 makes 100,000 points, which need about 1.1 GiB of "
                                 "memory and this machine has 1.0 GiB available; lower samples")


def test_finished_points_are_taken_in_the_spec_order_then_the_first_error():
    # Points that finish together come back as a set, whose order is not the spec's (here the reverse):
    # the rows come in the spec's order, every finished row before the first failure.
    futures = [Future() for _ in range(6)]
    done = set(futures)
    pending = {future: index for index, future in enumerate(reversed(list(done)))}
    for future, index in pending.items():
        if index % 2:
            future.set_exception(UserError(f"point {index} cannot be built"))
        else:
            future.set_result({"point": index})
    rows = []
    with pytest.raises(UserError, match="^point 1 cannot"):
        for row in _in_order(done, pending):
            rows.append(row["point"])
    assert rows == [0, 2, 4] and not pending


def _family(pid: int) -> set[tuple[int, str]]:
    """The processes descended from `pid`, from /proc: (pid, start time) pairs, so a reused pid is not
    taken for one of them."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                children.setdefault(int(stat[1]), []).append((int(entry), stat[19]))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child[0])
    return found


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command: state, ppid, ... (field 22, the start time, is [19])."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()
    except OSError:
        return None


def _running(process: tuple[int, str]) -> bool:
    stat = _stat(process[0])
    return stat is not None and stat[19] == process[1] and stat[0] not in "ZX"


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="finds processes through /proc")
def test_a_killed_sweep_leaves_no_process_behind(tmp_path):
    rates = ", ".join(f"{rate}.0" for rate in range(1, 41))  # 80 points: far from done when killed
    path = _spec(tmp_path, SPEC.replace("[5.0, 10.0, 20.0]", f"[{rates}]"))
    sweep = subprocess.Popen([sys.executable, "-m", "tokenpath", "sweep", str(path), "--out", str(tmp_path / "o.csv"),
                              "--workers", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    family: set[tuple[int, str]] = set()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sweep.poll() is None:
            family |= _family(sweep.pid)
            workers = [p for p in family if _running(p) and int(_stat(p[0])[1]) != sweep.pid]  # the forkserver's
            if len(workers) >= 2:
                break
            time.sleep(0.05)
        assert sweep.poll() is None and len(workers) >= 2, "the sweep never had its two workers running"
        sweep.kill()
        sweep.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(map(_running, family)):
            time.sleep(0.05)
        left = [p for p in family if _running(p)]
        assert not left, f"{len(left)} of the sweep's {len(family)} processes outlived it"
    finally:
        sweep.kill()
        for pid, started in family:
            if _running((pid, started)):
                os.kill(pid, signal.SIGKILL)


def test_ray_missing_is_a_one_line_error(tmp_path):
    shadow = tmp_path / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no ray here')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "tokenpath", "sweep", str(_spec(tmp_path)), "--out",
                           str(tmp_path / "o.parquet"), "--ray"], capture_output=True, text=True, env=env)
    assert done.returncode == 2
    assert "pip install 'tokenpath[ray]'" in done.stderr and done.stderr.count("\n") == 1


@pytest.mark.parametrize("address", ["bogus", "", "10.0.0.5:0", "10.0.0.5:6379x", "http://10.0.0.5:6379"])
def test_a_ray_address_that_is_not_one_is_a_one_line_error(address, tmp_path, monkeypatch, capsys):
    from cli_helpers import assert_user_error, run_cli

    monkeypatch.setitem(sys.modules, "ray", None)  # refused before Ray is imported
    argv = ["sweep", str(_spec(tmp_path)), "--out", str(tmp_path / "o.csv"), "--ray-address", address]
    assert_user_error(*run_cli(argv, monkeypatch, capsys), f"--ray-address: {address!r} is not a Ray cluster's "
                      "address; give 'auto'", "or HOST:PORT")
    assert not (tmp_path / "o.csv").exists()


def test_ray_refusing_an_address_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    import types

    from cli_helpers import assert_user_error, run_cli

    def init(**kwargs):
        raise ValueError(f"Could not find any running Ray instance at {kwargs['address']}.\nPlease check it.")

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init)
    monkeypatch.setitem(sys.modules, "ray", fake)
    argv = ["sweep", str(_spec(tmp_path)), "--out", str(tmp_path / "o.csv"), "--ray-address", "10.0.0.5:6379"]
    assert_user_error(*run_cli(argv, monkeypatch, capsys), "--ray-address: cannot join the Ray cluster at "
                      "'10.0.0.5:6379' (Could not find any running Ray instance at 10.0.0.5:6379.)", "HOST:PORT")


def test_cli_writes_the_table_and_the_pareto_frontier(tmp_path):
    out = tmp_path / "r.parquet"
    done = subprocess.run([sys.executable, "-m", "tokenpath", "sweep", str(_spec(tmp_path)), "--out", str(out),
                           "--workers", "2", "--pareto", "throughput.output_tokens_per_s,latency_s.ttft.p99"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = pq.read_table(out).to_pylist()
    best = frontier(rows, [("throughput.output_tokens_per_s", "max"), ("latency_s.ttft.p99", "min")])
    written = pacsv.read_csv(tmp_path / "r.pareto.csv").to_pylist()
    assert [r["point"] for r in written] == [r["point"] for r in best]
    again = subprocess.run([sys.executable, "-m", "tokenpath", "sweep", str(_spec(tmp_path)), "--out", str(out)],
                           capture_output=True, text=True)
    assert again.returncode == 0 and "0 point(s) simulated, 6 already there" in again.stdout


def test_frontier_by_hand():
    rows = [{"point": p, "x": x, "y": y} for p, x, y in
            [("a", 10, 5), ("b", 8, 3), ("c", 8, 4), ("d", 12, 9), ("e", 5, 3), ("f", 12, 9)]]
    # maximize x, minimize y: a (10,5), b (8,3), d and f (12,9, equal) survive; c is beaten by b, e by b.
    assert [r["point"] for r in frontier(rows, [("x", "max"), ("y", "min")])] == ["d", "f", "a", "b"]
    assert parse_objectives("throughput.output_tokens_per_s,latency_s.ttft.p99") == \
        [("throughput.output_tokens_per_s", "max"), ("latency_s.ttft.p99", "min")]
    with pytest.raises(UserError, match="better high or low"):
        parse_objectives("engine.steps,latency_s.e2e.mean")


def test_frontier_on_continuity_metrics_infers_their_directions():
    rows = [{"point": p, "continuity.qoe.p10": q, "continuity.stalls_per_request": s} for p, q, s in
            [("a", 0.95, 0.5), ("b", 0.99, 1.0), ("c", 0.90, 0.2), ("d", 0.94, 0.6), ("e", 0.99, 1.2)]]
    objectives = parse_objectives("continuity.qoe.p10,continuity.stalls_per_request")
    assert objectives == [("continuity.qoe.p10", "max"), ("continuity.stalls_per_request", "min")]
    # QoE up, stalls down: d is beaten by a (better on both), e by b (same QoE, more stalls)
    assert [r["point"] for r in frontier(rows, objectives)] == ["b", "a", "c"]


def test_the_sweep_counts_its_overloaded_points(tmp_path):
    spec = _spec(tmp_path, """
scenario = "typical"
[overrides]
"workload.num_requests" = 150
[axes]
"workload.arrival.rate" = [5.0, 500.0]
""")
    done = subprocess.run([sys.executable, "-m", "tokenpath", "sweep", str(spec), "--out", str(tmp_path / "o.csv")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {row["workload.arrival.rate"]: row for row in pacsv.read_csv(tmp_path / "o.csv").to_pylist()}
    assert rows[500.0]["load.overloaded"] is True and rows[5.0]["load.overloaded"] is False
    assert "1 of 2 point(s) overloaded, 0 still filling when their sends stopped" in " ".join(done.stdout.split())


def test_a_sweep_tables_axis_columns_are_its_specs_axes(tmp_path):
    # the HTML report's sweep figure labels each point by these: not by its metrics (prefix_cache.*,
    # routing.*, bottleneck_reason) nor its ids
    spec = load_spec(_spec(tmp_path))
    run_sweep(spec, tmp_path / "r.parquet", workers=1)
    columns = pq.read_table(tmp_path / "r.parquet").column_names
    assert axis_columns(columns) == list(spec.points[0])


@pytest.mark.parametrize("axis, message", [
    ('{min = -1.7e308, max = 1.7e308}', "is wider than a float holds"),
    ('{min = 1, max = 1' + "0" * 400 + '}', "a range needs numbers min < max"),
], ids=["float-width", "int-past-float"])
def test_a_range_past_a_floats_bounds_is_a_user_error(tmp_path, axis, message):
    # numpy's uniform raised OverflowError (high - low past a float), and math.isfinite an integer past a
    # float's range: tracebacks, where every other bad range is one line.
    text = f'scenario = "typical"\nsamples = 2\n[axes]\n"seed" = {axis}\n'
    with pytest.raises(UserError, match=message) as error:
        load_spec(_spec(tmp_path, text))
    assert "\n" not in str(error.value)


# The sweeps on Ray come last: the module's Ray, once started, runs until the module's last test.
@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for this module's sweeps on Ray, joined as `--ray` joins one (starting it takes most of
    each such test's time). A sweep leaves running a Ray it did not start, and shuts down one it did: that is
    test_a_sweep_shuts_down_only_the_ray_it_started's to check."""
    pytest.importorskip("ray")
    ray, started = join_ray(None)
    assert started
    yield ray
    ray.shutdown()


def test_ray_gives_identical_rows(tmp_path, local_ray):
    spec = load_spec(_spec(tmp_path))
    run_sweep(spec, tmp_path / "local.parquet", workers=2)
    run_sweep(spec, tmp_path / "ray.parquet", ray=True)
    local = pq.read_table(tmp_path / "local.parquet").to_pylist()
    on_ray = pq.read_table(tmp_path / "ray.parquet").to_pylist()
    assert local == on_ray  # same rows, same order (the spec's)


def test_a_sweep_shuts_down_only_the_ray_it_started(tmp_path, monkeypatch):
    """`--ray` starts a local Ray where this process has none, and shuts it down when the sweep ends; a Ray
    the process had already joined it leaves running."""
    import types

    calls = []

    class Ref:
        def __init__(self, value):
            self.value = value

    def fake_ray(initialized):
        return types.SimpleNamespace(
            is_initialized=lambda: initialized, init=lambda **options: calls.append("init"),
            remote=lambda function: types.SimpleNamespace(remote=lambda *args: Ref(function(*args))),
            wait=lambda refs, num_returns: (refs[:1], refs[1:]), get=lambda ref: ref.value,
            cancel=lambda ref: None, shutdown=lambda: calls.append("shutdown"))

    spec = load_spec(_spec(tmp_path, 'scenario = "typical"\n[overrides]\n"workload.num_requests" = 20\n'
                                     '[axes]\n"workload.arrival.rate" = [5.0]\n'))
    monkeypatch.setitem(sys.modules, "ray", fake_ray(False))
    assert run_sweep(spec, tmp_path / "started.csv", ray=True).ran == 1
    assert calls == ["init", "shutdown"]
    calls.clear()
    monkeypatch.setitem(sys.modules, "ray", fake_ray(True))
    assert run_sweep(spec, tmp_path / "joined.csv", ray=True).ran == 1
    assert calls == []


@pytest.mark.parametrize("where", [["--workers", "1"], ["--ray"]])
def test_a_point_that_cannot_be_built_stops_the_sweep_with_one_line_naming_it(tmp_path, where, request, monkeypatch,
                                                                              capsys):
    # 12 chips do not split into TP8 replicas: the scenario is valid, its deployment cannot be built (on Ray
    # too: its wrapping of the point's error, a worker's traceback, is taken off)
    path = _spec(tmp_path, SPEC.replace("delivery.stream_interval = [1, 4]", '"deployment.chips" = [8, 12]'))
    argv = ["sweep", str(path), "--out", str(tmp_path / "o.csv"), *where]
    if "--ray" in where:
        # the command in this process, on the module's Ray; the --workers case runs it as a process of its own
        from cli_helpers import run_cli

        request.getfixturevalue("local_ray")
        code, _, stderr = run_cli(argv, monkeypatch, capsys)
    else:
        done = subprocess.run([sys.executable, "-m", "tokenpath", *argv], capture_output=True, text=True)
        code, stderr = done.returncode, done.stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in stderr, stderr
    assert errors[0].startswith("error: point workload.arrival.rate=") and "deployment.chips=12" in errors[0]
    assert errors[0].endswith("use a multiple of 8"), errors[0]
    table = tmp_path / "o.csv"  # what finished before it is kept (on Ray, the failure may come first)
    kept = pacsv.read_csv(table).to_pylist() if table.exists() else []
    assert all(row["deployment.chips"] == 8 for row in kept) and (kept or "--ray" in where)
