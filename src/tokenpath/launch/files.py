"""`launch_files`: a scenario's deployment as the files that launch it on one engine."""

from __future__ import annotations

from tokenpath.config.errors import UserError
from tokenpath.engine.release import release_at_least, release_number
from tokenpath.launch import k8s, scripts, sglang, trtllm, vllm
from tokenpath.launch.command import Settings
from tokenpath.launch.flags import programs
from tokenpath.launch.plan import Plan, make_plan
from tokenpath.sim.scenario import Scenario

K8S = "k8s"
_EMITTERS = {vllm.NAME: scripts.vllm_files, sglang.NAME: scripts.sglang_files, trtllm.NAME: scripts.trtllm_files}
ENGINES = (*_EMITTERS, K8S)


def launch_files(scenario: Scenario, engine: str, model_id: str | None = None) -> dict[str, str]:
    """The files that launch `scenario`'s deployment, file name -> text.

    `engine` is "vllm" (launch-vllm.sh), "sglang" (launch-sglang.sh), TensorRT-LLM's (launch-*.sh and the
    YAML files its servers read) or "k8s" (k8s.yaml: a Deployment and a Service per pool, the pods
    running the engine of the scenario's scheduler profile). Each file opens with comments listing the
    scenario settings no flag carries. `model_id` overrides the catalog's Hugging Face id (a model
    without one needs it). Raises UserError for an unknown engine, a model without an id, or a
    deployment `simulate` would refuse.
    """
    return emit(make_plan(scenario, model_id), engine)[0]


def emit(plan: Plan, engine: str) -> tuple[dict[str, str], Settings]:
    """The files and, for each scenario setting, the flags that carry it or the note saying why none does."""
    settings = Settings()
    if engine == K8S:
        _check_chip(plan, plan.profile.launched_with, True)
        _check_release(plan, plan.profile.launched_with)
        return {"k8s.yaml": k8s.manifest(plan, settings)[1]}, settings
    if engine not in _EMITTERS:
        raise UserError(f"--engine: unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    _check_chip(plan, engine, False)
    _check_release(plan, engine)
    return _EMITTERS[engine](plan, settings), settings


# The chips, by vendor, no emitter writes a launch for: each engine serves them through a backend of its
# own, with its own image and flags (vLLM's vllm-tpu, github.com/vllm-project/tpu-inference, and its
# vllm-gaudi plugin, github.com/vllm-project/vllm-gaudi).
_NOT_LAUNCHED = {
    "google": "a Google TPU, which vLLM serves as vllm-tpu (its tpu-inference backend)",
    "intel": "an Intel Gaudi, which vLLM serves through its vllm-gaudi plugin",
}


def _check_chip(plan: Plan, engine: str, manifest: bool) -> None:
    """Refuse a launch on a chip `engine` does not run on: a TPU or a Gaudi for any engine (each served by
    a backend with its own image and flags), an AMD GPU for TensorRT-LLM (NVIDIA's GPUs only)."""
    chip = plan.scenario.deployment.chip
    if plan.vendor in _NOT_LAUNCHED:
        raise UserError(f"deployment.chip: {chip} is {_NOT_LAUNCHED[plan.vendor]}, with its own image and flags, "
                        "which tokenpath launch does not write (it writes launches on NVIDIA and AMD GPUs): start "
                        "this deployment by hand")
    if plan.vendor == "amd" and engine == trtllm.NAME:
        how = ("the manifest runs the engine of engine.scheduler = trtllm: simulate with vllm-v1 or prefill-first "
               "to launch vLLM or SGLang" if manifest else "launch it with --engine vllm or sglang")
        raise UserError(f"deployment.chip: {chip} is an AMD GPU and TensorRT-LLM runs on NVIDIA GPUs only; {how}")


def _check_release(plan: Plan, engine: str) -> None:
    """Refuse a launch on the engine the scenario's profile simulates when the scenario states a release
    older than the one whose flags flags.toml records: flags come and go between releases (vLLM 0.8.3 has
    no --api-server-count, SGLang 0.4.6 no --pp-size), and the emitters write that one release's."""
    stated = plan.scenario.engine.version
    recorded = programs()[engine]["version"]
    if plan.profile.launched_with != engine or release_number(recorded) is None:
        return
    if not release_at_least(stated, recorded):
        raise UserError(f"engine.version: tokenpath launch writes {engine} {recorded}'s flags (launch/flags.toml) "
                        f"and the scenario states {stated}, an earlier release whose flags differ; unset "
                        "engine.version to launch the newest release")
