"""`tokenpath launch`: every flag and YAML key an emitter writes is one its engine version defines
(launch/flags.toml, read from each engine's source), every server setting of the scenario is carried by
a flag or noted, the vLLM command of a known deployment is exactly the expected one, and the Kubernetes
manifest parses with the replicas and GPUs of the deployment."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli_helpers import assert_user_error, run_cli
from tokenpath.compute.model import list_models
from tokenpath.config.errors import UserError
from tokenpath.launch import ENGINES, launch_files, sglang
from tokenpath.launch.command import Command, shell_words
from tokenpath.launch.files import emit
from tokenpath.launch.flags import check_yaml_keys, parse, programs
from tokenpath.launch.hosts import hosts
from tokenpath.launch.model_id import Checkpoint, checkpoint
from tokenpath.launch.plan import SETTINGS, make_plan
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.scenario import Scenario, load_scenario

# Deployments covering each way the emitters lay one out: TP x DP, PP, disaggregated pools, fp8 KV,
# prefix caching off, no CUDA graphs, graphs for decodes up to a size, an MoE over expert parallelism,
# and the other profiles' defaults (SGLang's prefills alone, TensorRT-LLM's reservations).
SCENARIOS = {
    "tp2-dp4": {"deployment.tp": 2},
    "tp2-pp2-dp2": {"deployment.tp": 2, "deployment.pp": 2},
    "disaggregated-1p3d": {"deployment.tp": 2, "deployment.prefill_replicas": 1},
    "fp8-kv-no-prefix-cache": {"model.kv_cache_precision": "fp8", "engine.prefix_caching": False},
    "eager-bf16": {"engine.cuda_graphs": "none", "model.precision": "bf16"},
    "decode-graphs": {"engine.cuda_graphs": "decode", "engine.cuda_graph_max_tokens": 256, "deployment.tp": 4},
    "moe-expert-parallel": {"model.name": "qwen3-30b-a3b", "deployment.expert_parallel": True, "deployment.chips": 4,
                            "deployment.tp": 4},
    "sglang-profile": {"engine.scheduler": "prefill-first", "deployment.tp": 4, "deployment.routing": "prefix_aware"},
    "trtllm-profile-disaggregated": {"engine.scheduler": "trtllm", "deployment.tp": 4,
                                     "deployment.prefill_replicas": 1},
    "vllm-v0-unchunked": {"engine.scheduler": "vllm-v0", "engine.chunked_prefill": False,
                          "engine.num_scheduler_steps": 8},
    "dp-attention": {"model.name": "deepseek-v3", "deployment.tp": 8, "deployment.attention_dp": True},
    "dp-attention-two-replicas": {"model.name": "qwen3-235b-a22b", "deployment.tp": 4,
                                  "deployment.attention_dp": True, "deployment.routing": "least_outstanding"},
    "dp-attention-disaggregated": {"model.name": "qwen3-235b-a22b", "deployment.tp": 2,
                                   "deployment.attention_dp": True, "deployment.prefill_replicas": 2},
    "mtp": {"model.name": "deepseek-v3", "deployment.tp": 8, "workload.draft_acceptance": 0.7,
            "engine.speculative": {"method": "mtp", "num_speculative_tokens": 2}},
    "eagle3-sglang": {"engine.scheduler": "prefill-first", "workload.draft_acceptance": 0.7,
                      "engine.speculative": {"method": "eagle3", "num_speculative_tokens": 3}},
    "trtllm-ngram": {"engine.scheduler": "trtllm", "workload.draft_acceptance": 0.5,
                     "engine.speculative": {"method": "ngram", "num_speculative_tokens": 4}},
    "two-hosts-tp8-pp2": {"model.name": "llama-3.1-405b", "deployment.chips": 16, "deployment.tp": 8,
                          "deployment.pp": 2},
    "replicas-over-hosts": {"deployment.chips": 16, "deployment.tp": 4},
    "ep-all-to-all": {"model.name": "deepseek-v3", "deployment.chips": 16, "deployment.tp": 16,
                      "deployment.expert_parallel": True, "deployment.moe_all_to_all": True},
}


# Speculative decoding: DeepSeek-V3's own MTP layers drafting 2 tokens a step, on one 8-GPU replica.
MTP = {"model.name": "deepseek-v3", "deployment.tp": 8,
       "engine.speculative": {"method": "mtp", "num_speculative_tokens": 2}, "workload.draft_acceptance": 0.7}


def _scenario(name: str) -> Scenario:
    return load_scenario("typical", SCENARIOS[name])


def _speculative(method: str, k: int, **more: object) -> Scenario:
    """The typical deployment at tp 2 with a drafter of `k` tokens a step."""
    return load_scenario("typical", {"deployment.tp": 2, "workload.draft_acceptance": 0.7,
                                     "engine.speculative": {"method": method, "num_speculative_tokens": k, **more}})


def _values(argv: list[str], flag: str) -> list[str]:
    """The values after `flag` in a command line, up to the next flag."""
    start = argv.index(flag) + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    return argv[start:end]


def _speculative_flags(argv: list[str]) -> list[str]:
    """The --speculative-* flags of an SGLang command line, with their values, in order."""
    out: list[str] = []
    for i, word in enumerate(argv):
        if word.startswith("--speculative-"):
            end = next((j for j in range(i + 1, len(argv)) if argv[j].startswith("--")), len(argv))
            out += argv[i:end]
    return out


def _k8s_documents(text: str) -> list[dict]:
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    return [json.loads(part) for part in body.split("\n---\n")]


def _pod_templates(document: dict) -> list[dict]:
    """The pod templates of a manifest object: a Deployment's, a LeaderWorkerSet's leader and worker."""
    if document["kind"] == "Deployment":
        return [document["spec"]["template"]]
    if document["kind"] == "LeaderWorkerSet":
        group = document["spec"]["leaderWorkerTemplate"]
        return [group["leaderTemplate"], group["workerTemplate"]]
    return []


def _check_files(written: dict[str, str]) -> int:
    """Check every command and YAML document of the launch files against flags.toml; how many commands."""
    commands = 0
    for name, text in written.items():
        if name.endswith(".sh"):
            for argv in shell_words(text):
                parse(argv)
                commands += 1
        elif name == "disagg.yaml":
            check_yaml_keys("trtllm-disaggregated", json.loads(text))
        elif name == "k8s.yaml":
            for document in _k8s_documents(text):
                for template in _pod_templates(document):
                    parse(template["spec"]["containers"][0]["command"])
                    commands += 1
                if document["kind"] == "ConfigMap":
                    for config in document["data"].values():
                        check_yaml_keys("trtllm", json.loads(config))
        else:
            check_yaml_keys("trtllm", json.loads(text))
    return commands


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", SCENARIOS)
def test_every_flag_written_is_one_the_engine_version_defines(name, engine):
    written, settings = emit(make_plan(_scenario(name)), engine)
    assert _check_files(written) >= 1
    # every server setting is carried by a flag or noted, and nothing else is
    noted = {note.setting for note in settings.notes}
    assert set(SETTINGS) <= set(settings.mapped) | noted, set(SETTINGS) - set(settings.mapped) - noted
    assert noted | set(settings.mapped) <= set(SETTINGS)


def test_the_vllm_command_for_llama_70b_fp8_tp2_dp4_on_8_h200():
    scenario = load_scenario("typical", {"deployment.tp": 2})  # Llama-3.1-70B FP8 on 8x H200, so 4 replicas
    (script,) = launch_files(scenario, "vllm").values()
    assert shell_words(script) == [[
        "vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct",
        "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1", "--data-parallel-size", "4",
        "--quantization", "fp8_per_tensor",   # bf16 weights quantized as vLLM 0.34 loads them
        "--kv-cache-dtype", "bfloat16",       # vllm-v1's KV cache: the activations' bf16, written out
        "--max-num-seqs", "1024", "--max-num-batched-tokens", "8192", "--block-size", "64",
        "--enable-chunked-prefill", "--enable-prefix-caching",  # the memory share vLLM's own, as simulated
        "--async-scheduling",                 # the newest vLLM's default, as modelled (written out)
        "--api-server-count", "4",            # one per data-parallel replica
        "--stream-interval", "1",
    ]]
    assert "deployment.routing: vLLM's API servers send each request to the engine with the fewest" in script


def test_an_moe_models_vllm_replicas_are_a_server_each():
    """One `vllm serve` would run an MoE model's replicas as data-parallel engines that step together, their
    experts one tensor-parallel group over all the chips; the scenario's replicas are apart, so each is a
    server of its own on its GPUs and port (a dense model's replicas stay one server's engines)."""
    scenario = load_scenario("typical", {"model.name": "qwen3-30b-a3b", "deployment.chips": 4, "deployment.tp": 2})
    script = launch_files(scenario, "vllm")["launch-vllm.sh"]
    servers = shell_words(script)
    assert [(argv[argv.index("--tensor-parallel-size") + 1], argv[argv.index("--data-parallel-size") + 1],
             argv[argv.index("--port") + 1]) for argv in servers] == [("2", "1", "8100"), ("2", "1", "8101")]
    assert "CUDA_VISIBLE_DEVICES=0,1 vllm serve" in script and "CUDA_VISIBLE_DEVICES=2,3 vllm serve" in script
    assert "deployment.routing: each replica is a vllm serve of its own: put a load balancer" in script
    assert "# replica 1 of 2: a server of its own (an MoE model's data-parallel engines in one server would step " \
           "together)" in script
    dense = launch_files(load_scenario("typical", {"deployment.chips": 4, "deployment.tp": 2}), "vllm")
    assert [argv[argv.index("--data-parallel-size") + 1] for argv in shell_words(dense["launch-vllm.sh"])] == ["2"]


def test_disaggregated_vllm_pools_run_the_nixl_connector_on_their_own_gpus():
    written = launch_files(_scenario("disaggregated-1p3d"), "vllm")
    prefill, decode = shell_words(written["launch-vllm.sh"])
    script = written["launch-vllm.sh"]
    assert "CUDA_VISIBLE_DEVICES=0,1 VLLM_NIXL_SIDE_CHANNEL_PORT=5600 vllm serve" in script
    assert "CUDA_VISIBLE_DEVICES=2,3,4,5,6,7 VLLM_NIXL_SIDE_CHANNEL_PORT=5601 vllm serve" in script
    for argv, replicas in ((prefill, "1"), (decode, "3")):
        options = dict((flag, values) for flag, values in parse(argv)[2])
        assert options["--data-parallel-size"] == [replicas]
        assert json.loads(options["--kv-transfer-config"][0]) == {"kv_connector": "NixlConnector",
                                                                  "kv_role": "kv_both"}


def test_vllm_pools_side_channel_ports_do_not_overlap():
    # each data-parallel engine listens on VLLM_NIXL_SIDE_CHANNEL_PORT plus its rank: two prefill replicas
    # take 5600 and 5601, so the decode pool starts at 5602
    scenario = load_scenario("typical", {"deployment.tp": 2, "deployment.prefill_replicas": 2})
    script = launch_files(scenario, "vllm")["launch-vllm.sh"]
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3 VLLM_NIXL_SIDE_CHANNEL_PORT=5600 vllm serve" in script
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7 VLLM_NIXL_SIDE_CHANNEL_PORT=5602 vllm serve" in script


@pytest.mark.parametrize(("name", "pools"), [
    ("tp2-dp4", [("server", 4, 2)]),
    ("tp2-pp2-dp2", [("server", 2, 4)]),
    ("disaggregated-1p3d", [("prefill", 1, 2), ("decode", 3, 2)]),
])
def test_the_manifest_has_a_deployment_per_pool_with_its_replicas_and_gpus(name, pools):
    documents = _k8s_documents(launch_files(_scenario(name), "k8s")["k8s.yaml"])
    deployments = [d for d in documents if d["kind"] == "Deployment"]
    assert [(d["metadata"]["labels"]["app.kubernetes.io/component"], d["spec"]["replicas"],
             d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
            for d in deployments] == pools
    assert len([d for d in documents if d["kind"] == "Service"]) == len(pools)
    for deployment in deployments:  # each pod runs one replica: vLLM's data parallelism is the pod count
        command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[command.index("--data-parallel-size") + 1] == "1"


def test_the_manifest_runs_the_engine_of_the_scenario_profile_with_its_yaml_mounted():
    documents = _k8s_documents(launch_files(_scenario("trtllm-profile-disaggregated"), "k8s")["k8s.yaml"])
    kinds = [(d["kind"], d["metadata"]["name"]) for d in documents]
    assert kinds == [(kind, f"typical-{pool}") for pool in ("prefill", "decode")
                     for kind in ("ConfigMap", "Deployment", "Service")]
    container = documents[1]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == programs()["trtllm"]["image"]
    assert container["command"][:2] == ["trtllm-serve", "meta-llama/Llama-3.1-70B-Instruct"]
    assert "/etc/tokenpath/extra-llm-api-prefill.yaml" in container["command"]
    config = json.loads(documents[0]["data"]["extra-llm-api-prefill.yaml"])
    assert config["cache_transceiver_config"] == {"backend": "NIXL"}
    assert config["scheduler_config"] == {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"}  # kv_admission reserve


@pytest.mark.parametrize(("overrides", "kinds"), [
    ({}, {"Deployment", "Service"}),
    ({"model.name": "llama-3.1-405b", "deployment.chips": 16, "deployment.pp": 2}, {"LeaderWorkerSet", "Service"}),
])
def test_a_manifest_on_amd_gpus_asks_the_amd_device_plugin_and_runs_vllms_rocm_image(overrides, kinds):
    def containers(chip: str) -> list[dict]:
        text = launch_files(load_scenario("typical", {"deployment.chip": chip, **overrides}), "k8s")["k8s.yaml"]
        documents = _k8s_documents(text)
        assert {d["kind"] for d in documents} == kinds
        return [t["spec"]["containers"][0] for d in documents if d["kind"] != "Service" for t in _pod_templates(d)]

    amd = containers("mi300x")
    assert amd and all(c["image"] == "vllm/vllm-openai-rocm:v0.34.0" == programs()["vllm"]["rocm_image"]
                       and c["resources"] == {"limits": {"amd.com/gpu": 8}} for c in amd)
    assert all(c["image"] == "vllm/vllm-openai:v0.34.0" and c["resources"] == {"limits": {"nvidia.com/gpu": 8}}
               for c in containers("h200"))


@pytest.mark.parametrize(("engine", "scheduler", "message"), [
    ("trtllm", "vllm-v1", "deployment.chip: {chip} is an AMD GPU and TensorRT-LLM runs on NVIDIA GPUs only; launch "
                          "it with --engine vllm or sglang"),
    ("k8s", "trtllm", "deployment.chip: {chip} is an AMD GPU and TensorRT-LLM runs on NVIDIA GPUs only; the manifest "
                      "runs the engine of engine.scheduler = trtllm: simulate with vllm-v1 or prefill-first to launch "
                      "vLLM or SGLang"),
    ("k8s", "prefill-first", "deployment.chip: {chip} is an AMD GPU, and tokenpath knows no ROCm image of sglang "
                             "0.5.23 (launch/flags.toml): launch it with --engine sglang on hosts with its ROCm build, "
                             "or simulate with engine.scheduler = vllm-v1 to run vLLM's"),
])
@pytest.mark.parametrize("chip", ["mi300x", "mi325x"])
def test_an_engine_or_image_that_does_not_run_on_amd_gpus_is_refused(chip, engine, scheduler, message, monkeypatch,
                                                                    capsys):
    line = assert_user_error(*run_cli(["launch", "--engine", engine, "--chip", chip, "--scheduler", scheduler],
                                      monkeypatch, capsys))
    assert line == "error: " + message.format(chip=chip)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("chip", "what"), [
    ("tpu-v5p", "a Google TPU, which vLLM serves as vllm-tpu (its tpu-inference backend)"),
    ("tpu-v6e", "a Google TPU, which vLLM serves as vllm-tpu (its tpu-inference backend)"),
    ("gaudi3", "an Intel Gaudi, which vLLM serves through its vllm-gaudi plugin"),
])
def test_a_launch_on_a_tpu_or_a_gaudi_is_refused(chip, what, engine):
    scenario = load_scenario("typical", {"deployment.chip": chip, "model.precision": "bf16"})
    with pytest.raises(UserError) as error:
        launch_files(scenario, engine)
    assert str(error.value) == (f"deployment.chip: {chip} is {what}, with its own image and flags, which tokenpath "
                                "launch does not write (it writes launches on NVIDIA and AMD GPUs): start this "
                                "deployment by hand")


def test_trtllm_disaggregated_config_lists_each_server():
    written = launch_files(_scenario("trtllm-profile-disaggregated"), "trtllm")
    assert json.loads(written["disagg.yaml"]) == {
        "hostname": "0.0.0.0", "port": 8000, "backend": "pytorch",
        "context_servers": {"num_instances": 1, "urls": ["127.0.0.1:8100"]},
        "generation_servers": {"num_instances": 1, "urls": ["127.0.0.1:8101"]}}
    assert json.loads(written["extra-llm-api-prefill.yaml"])["disable_overlap_scheduler"] is True
    assert json.loads(written["extra-llm-api-decode.yaml"])["disable_overlap_scheduler"] is False


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("spec", [
    {"method": "mtp", "num_speculative_tokens": 2},
    {"method": "eagle", "num_speculative_tokens": 3},
    {"method": "eagle3", "num_speculative_tokens": 3},
    {"method": "ngram", "num_speculative_tokens": 4},
    {"method": "draft_model", "num_speculative_tokens": 3, "draft_model": "llama-3.2-1b"},
])
def test_every_server_setting_of_a_speculative_scenario_is_carried_or_noted(spec, engine):
    # (an MTP drafter runs the model's own MTP layers: DeepSeek-V3's, which need a node a replica)
    layout = ({"model.name": "deepseek-v3", "deployment.tp": 8, "deployment.chips": 16} if spec["method"] == "mtp"
              else {"deployment.tp": 2})
    scenario = load_scenario("typical", {**layout, "deployment.prefill_replicas": 1,
                                         "engine.speculative": spec, "workload.draft_acceptance": 0.7})
    _, settings = emit(make_plan(scenario), engine)
    noted = {note.setting for note in settings.notes}
    assert set(SETTINGS) <= set(settings.mapped) | noted, set(SETTINGS) - set(settings.mapped) - noted
    assert noted | set(settings.mapped) <= set(SETTINGS)
    assert "engine.speculative" in set(settings.mapped) | noted


@pytest.mark.parametrize("engine", ENGINES)
def test_no_speculative_table_is_no_drafter(engine):
    _, settings = emit(make_plan(_scenario("tp2-dp4")), engine)
    assert settings.mapped["engine.speculative"] == ["(none)"]
    assert "engine.speculative" not in {note.setting for note in settings.notes}


def test_mtp_on_deepseek_v3_is_vllm_speculative_config_with_its_own_layers():
    (script,) = launch_files(load_scenario("typical", MTP), "vllm").values()
    (argv,) = shell_words(script)
    assert argv[2] == "deepseek-ai/DeepSeek-V3"
    assert _values(argv, "--speculative-config") == ['{"method":"mtp","num_speculative_tokens":2}']
    assert "engine.speculative" not in script  # carried whole: vLLM loads the MTP layers from the model


def test_mtp_on_deepseek_v3_is_sglang_nextn_as_a_chain_of_2_drafts():
    (argv,) = shell_words(launch_files(load_scenario("typical", MTP), "sglang")["launch-sglang.sh"])
    assert _speculative_flags(argv) == [
        "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "3",  # the 2 drafts and the token they follow
    ]  # no --speculative-draft-model-path: SGLang takes DeepSeek-V3's MTP layers from --model-path


def test_mtp_on_deepseek_v3_is_trtllm_mtp_decoding_of_2_layers():
    written = launch_files(load_scenario("typical", MTP), "trtllm")
    assert json.loads(written["extra-llm-api-server.yaml"])["speculative_config"] == {
        "decoding_type": "MTP", "num_nextn_predict_layers": 2}
    assert "engine.speculative" not in written["launch-trtllm.sh"]


def test_every_pool_of_a_disaggregated_deployment_drafts():
    scenario = load_scenario("typical", {**MTP, "deployment.chips": 16, "deployment.prefill_replicas": 1})
    for argv in shell_words(launch_files(scenario, "vllm")["launch-vllm.sh"]):
        assert _values(argv, "--speculative-config") == ['{"method":"mtp","num_speculative_tokens":2}']
    written = launch_files(scenario, "trtllm")
    for pool in ("prefill", "decode"):
        assert json.loads(written[f"extra-llm-api-{pool}.yaml"])["speculative_config"]["decoding_type"] == "MTP"


def test_an_eagle3_launch_says_to_add_the_head_it_cannot_know():
    scenario = _speculative("eagle3", 3)
    vllm_script = launch_files(scenario, "vllm")["launch-vllm.sh"]
    assert _values(shell_words(vllm_script)[0], "--speculative-config") == [
        '{"method":"eagle3","num_speculative_tokens":3}']
    assert ("engine.speculative: add the EAGLE3 head's checkpoint (one trained for "
            "meta-llama/Llama-3.1-70B-Instruct) as \"model\" in --speculative-config: vLLM refuses an EAGLE "
            "method without it") in vllm_script
    sglang_script = launch_files(scenario, "sglang")["launch-sglang.sh"]
    assert _speculative_flags(shell_words(sglang_script)[0]) == [
        "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4"]
    assert ("engine.speculative: add --speculative-draft-model-path with the EAGLE3 head's checkpoint (one "
            "trained for meta-llama/Llama-3.1-70B-Instruct): SGLang needs it for an EAGLE algorithm") in sglang_script
    written = launch_files(scenario, "trtllm")
    assert json.loads(written["extra-llm-api-server.yaml"])["speculative_config"] == {
        "decoding_type": "Eagle", "max_draft_len": 3}
    assert ("engine.speculative: add speculative_model_dir with the EAGLE3 head's checkpoint (one trained for "
            "meta-llama/Llama-3.1-70B-Instruct) to speculative_config: TensorRT-LLM refuses Eagle without it"
            ) in written["launch-trtllm.sh"]


def test_a_draft_model_is_served_by_its_catalog_checkpoint():
    scenario = _speculative("draft_model", 3, draft_model="llama-3.2-1b")
    (argv,) = shell_words(launch_files(scenario, "vllm")["launch-vllm.sh"])
    assert json.loads(_values(argv, "--speculative-config")[0]) == {
        "method": "draft_model", "num_speculative_tokens": 3, "model": "meta-llama/Llama-3.2-1B-Instruct"}
    (argv,) = shell_words(launch_files(scenario, "sglang")["launch-sglang.sh"])
    assert _speculative_flags(argv) == [
        "--speculative-algorithm", "STANDALONE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--speculative-draft-model-path", "meta-llama/Llama-3.2-1B-Instruct"]
    written = launch_files(scenario, "trtllm")
    assert "speculative_config" not in json.loads(written["extra-llm-api-server.yaml"])
    assert ("add speculative_config with that of yours, max_draft_len: 3 and speculative_model_dir: "
            "meta-llama/Llama-3.2-1B-Instruct") in written["launch-trtllm.sh"]


def test_ngram_drafts_a_chain_of_prompt_lookups():
    scenario = _speculative("ngram", 4)
    (argv,) = shell_words(launch_files(scenario, "vllm")["launch-vllm.sh"])
    assert _values(argv, "--speculative-config") == ['{"method":"ngram","num_speculative_tokens":4}']
    (argv,) = shell_words(launch_files(scenario, "sglang")["launch-sglang.sh"])
    assert _speculative_flags(argv) == [  # SGLang's n-gram top-k is its tree's breadth
        "--speculative-algorithm", "NGRAM", "--speculative-ngram-max-bfs-breadth", "1",
        "--speculative-num-draft-tokens", "5"]
    config = json.loads(launch_files(scenario, "trtllm")["extra-llm-api-server.yaml"])["speculative_config"]
    assert config == {"decoding_type": "NGram", "max_draft_len": 4}


def test_trtllm_graphs_for_every_decode_batch_go_up_to_the_largest_batch():
    # vLLM V1's profile replays a graph at any size; TensorRT-LLM's CudaGraphConfig.max_batch_size takes a
    # number (null fails its validation), so the largest batch the server forms
    written = launch_files(load_scenario("typical"), "trtllm")
    (argv,) = shell_words(written["launch-trtllm.sh"])
    config = json.loads(written["extra-llm-api-server.yaml"])
    assert config["cuda_graph_config"] == {"max_batch_size": int(_values(argv, "--max_batch_size")[0]),
                                           "enable_padding": True}
    decode = json.loads(launch_files(_scenario("decode-graphs"), "trtllm")["extra-llm-api-server.yaml"])
    assert decode["cuda_graph_config"]["max_batch_size"] == 256


def test_a_null_yaml_value_is_refused_where_the_engine_takes_none():
    check_yaml_keys("trtllm", {"cuda_graph_config": None})  # no CUDA graphs
    with pytest.raises(ValueError, match="cuda_graph_config.max_batch_size: null"):
        check_yaml_keys("trtllm", {"cuda_graph_config": {"max_batch_size": None, "enable_padding": True}})


def test_sglang_refuses_ngram_drafts_with_attention_data_parallel():
    scenario = load_scenario("typical", {**SCENARIOS["dp-attention"], "workload.draft_acceptance": 0.5,
                                         "engine.speculative": {"method": "ngram", "num_speculative_tokens": 3}})
    with pytest.raises(UserError, match="engine.speculative: SGLang drafts no n-grams with attention data-parallel"):
        launch_files(scenario, "sglang")


def test_sglang_runs_a_server_per_replica_behind_its_router_with_attention_data_parallel():
    # SGLang refuses --dp-size above 1 with --attn-dp-size (arg_groups/parallel_hook.py)
    script = launch_files(_scenario("dp-attention-two-replicas"), "sglang")["launch-sglang.sh"]
    first, second, router = shell_words(script)
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3 python -m sglang.launch_server" in script
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7 python -m sglang.launch_server" in script
    for argv, port in ((first, "8100"), (second, "8101")):
        assert (_values(argv, "--dp-size"), _values(argv, "--attn-dp-size"), _values(argv, "--port")) == (
            ["1"], ["4"], [port])
    assert _values(router, "--worker-urls") == ["http://127.0.0.1:8100", "http://127.0.0.1:8101"]
    assert _values(router, "--policy") == ["power_of_two"]  # the router has no least-outstanding policy


def test_sglang_disaggregated_pools_with_attention_data_parallel_give_each_prefill_server_its_bootstrap_port():
    *servers, router = shell_words(launch_files(_scenario("dp-attention-disaggregated"), "sglang")[
        "launch-sglang.sh"])
    assert [(_values(argv, "--disaggregation-mode"), _values(argv, "--dp-size"), _values(argv, "--port"))
            for argv in servers] == [(["prefill"], ["1"], ["8100"]), (["prefill"], ["1"], ["8101"]),
                                     (["decode"], ["1"], ["8102"]), (["decode"], ["1"], ["8103"])]
    assert [_values(argv, "--disaggregation-bootstrap-port") for argv in servers[:2]] == [["8998"], ["8999"]]
    options = parse(router)[2]
    assert [values for flag, values in options if flag == "--prefill"] == [
        ["http://127.0.0.1:8100", "8998"], ["http://127.0.0.1:8101", "8999"]]
    assert [values for flag, values in options if flag == "--decode"] == [
        ["http://127.0.0.1:8102"], ["http://127.0.0.1:8103"]]


@pytest.mark.parametrize(("engine", "scheduler", "release"), [("vllm", "vllm-v1", "0.8.3"), ("k8s", "vllm-v1", "0.8.3"),
                                                              ("sglang", "prefill-first", "0.4.6")])
def test_a_launch_for_a_release_older_than_the_recorded_flags_is_refused(engine, scheduler, release):
    scenario = load_scenario("typical", {"engine.scheduler": scheduler, "engine.version": release})
    with pytest.raises(UserError, match=rf"engine.version: .* the scenario states {release}, an earlier release"):
        launch_files(scenario, engine)


def test_a_stated_release_the_flags_cover_or_another_engines_launches():
    assert launch_files(load_scenario("typical", {"engine.version": "0.34.1"}), "vllm")
    assert launch_files(load_scenario("typical", {"engine.version": "0.8.3"}), "sglang")  # vLLM's release


def test_every_catalog_model_names_a_checkpoint_to_serve():
    for name in list_models():
        served = checkpoint(Scenario.model_validate({"model": {"name": name}}))
        assert "/" in served.hf_id and served.precision in ("bf16", "fp8", "fp4"), name
    assert checkpoint(Scenario()) == Checkpoint("meta-llama/Llama-3.1-70B-Instruct", "bf16")
    assert checkpoint(Scenario.model_validate({"model": {"name": "deepseek-v3"}})).precision == "fp8"


def test_a_model_without_a_hugging_face_id_needs_model_id(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
                                  "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                                  "vocab_size": 128256, "max_position_embeddings": 131072}), encoding="utf-8")
    scenario = load_scenario("typical", {"model.name": str(config)})
    with pytest.raises(UserError) as error:
        launch_files(scenario, "vllm")
    assert str(error.value) == f"model {str(config)!r} has no hf_id; pass --model-id"
    script = launch_files(scenario, "vllm", model_id="my-org/my-llama-fp8")["launch-vllm.sh"]
    assert shell_words(script)[0][2] == "my-org/my-llama-fp8"
    assert "model.precision: served as the --model-id checkpoint stores it: use one stored in fp8" in script


def test_a_model_named_by_its_hugging_face_id_is_served_by_that_id():
    scenario = load_scenario("typical", {"model.name": "meta-llama/Llama-3.3-70B-Instruct"})
    assert shell_words(launch_files(scenario, "vllm")["launch-vllm.sh"])[0][2] == "meta-llama/Llama-3.3-70B-Instruct"


def test_launch_writes_the_files_into_out(tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(["launch", "--engine", "trtllm", "--tp", "4", "--out", str(tmp_path / "deploy")],
                             monkeypatch, capsys)
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "deploy").iterdir()) == ["extra-llm-api-server.yaml",
                                                                       "launch-trtllm.sh"]
    assert (tmp_path / "deploy" / "launch-trtllm.sh").stat().st_mode & 0o111


def test_an_unknown_engine_is_one_line(monkeypatch, capsys):
    assert_user_error(*run_cli(["launch", "--engine", "docker"], monkeypatch, capsys),
                      "--engine: unknown engine 'docker'; use one of vllm, sglang, trtllm, k8s")


_VALUE = st.text(st.characters(codec="ascii", categories=("L", "N", "P", "S", "Zs")), min_size=1, max_size=12)


@given(st.sampled_from(["vllm", "sglang", "sglang-router", "trtllm"]), st.data())
def test_a_command_reads_back_as_it_was_built(program, data):
    """Rendering a command for the shell and parsing it back gives the same flags and values, whatever
    the values hold (quotes, spaces, JSON)."""
    spec = programs()[program]
    flags = [f for f, s in spec["flags"].items() if "values" not in s and s["kind"] != "values"]
    cmd = Command(list(spec["command"]), [data.draw(_VALUE.filter(lambda v: not v.startswith("-")))
                                          for _ in range(spec["positionals"])])
    built = []
    for flag in data.draw(st.lists(st.sampled_from(flags), max_size=6)):
        values = [] if spec["flags"][flag]["kind"] in ("switch", "bool") else [
            data.draw(_VALUE.filter(lambda v: not v.startswith("-")))]
        cmd.add(None, None, flag, *values)
        built.append((flag, values))
    (argv,) = shell_words(cmd.shell())
    assert argv == cmd.argv
    assert parse(argv) == (program, cmd.positionals, built)
    assert shlex.split(cmd.shell().replace("\\\n", " ")) == cmd.argv


@pytest.mark.parametrize(("engine", "eager_host", "noted"), [
    ("trtllm", False, "serve it with --backend tensorrt"),  # a TensorRT engine: the command runs PyTorch's
    ("sglang", False, "SGLang's model code runs in Python"),
    ("trtllm", None, None),  # the PyTorch backend, written as --backend
])
def test_a_scenario_whose_host_launches_from_cpp_is_noted_where_the_command_cannot_say_so(engine, eager_host, noted):
    scheduler = {"trtllm": "trtllm", "sglang": "prefill-first"}[engine]
    overrides = {"engine.scheduler": scheduler, **({} if eager_host is None else {"engine.eager_host": eager_host})}
    _, settings = emit(make_plan(load_scenario("typical", overrides)), engine)
    notes = [note.text for note in settings.notes if note.setting == "engine.eager_host"]
    if noted is None:
        assert notes == [] and settings.mapped["engine.eager_host"] == ["--backend"]
    else:
        assert len(notes) == 1 and noted in notes[0]


@pytest.mark.parametrize("share", [None, 0.8])
def test_sglang_and_vllm_keep_their_own_memory_share_unless_the_scenario_sets_one(share):
    overrides = {"engine.scheduler": "prefill-first"}
    if share is not None:
        overrides["engine.gpu_memory_utilization"] = share
    (argv,) = shell_words(launch_files(load_scenario("typical", overrides), "sglang")["launch-sglang.sh"])
    if share is None:
        assert "--mem-fraction-static" not in argv
    else:
        assert _values(argv, "--mem-fraction-static") == [str(share)]
    (vllm,) = shell_words(launch_files(load_scenario("typical", overrides), "vllm")["launch-vllm.sh"])
    if share is None:
        assert "--gpu-memory-utilization" not in vllm
    else:
        assert _values(vllm, "--gpu-memory-utilization") == [str(share)]


@pytest.mark.parametrize("seqs", [None, 512])
def test_sglang_keeps_its_own_running_requests_unless_the_scenario_sets_them(seqs):
    """Left out, SGLang sets them from its KV pool, as the simulation does (engine/batch_limits.py)."""
    overrides = {"engine.scheduler": "prefill-first", **({} if seqs is None else {"engine.max_num_seqs": seqs})}
    (argv,) = shell_words(launch_files(load_scenario("typical", overrides), "sglang")["launch-sglang.sh"])
    if seqs is None:
        assert "--max-running-requests" not in argv
    else:
        assert _values(argv, "--max-running-requests") == ["512"]


# -- deployments over several hosts -------------------------------------------------------------------


@given(st.integers(1, 64), st.integers(1, 32), st.integers(1, 16))
def test_hosts_hold_a_pool_evenly_on_the_fewest_that_can(replicas, gpus_per_replica, chips_per_host):
    layout = hosts(replicas, gpus_per_replica, chips_per_host)
    total = replicas * gpus_per_replica
    assert layout.count * layout.gpus_per_host == total and layout.gpus_per_host <= chips_per_host

    def even(count: int) -> bool:  # each host the same GPUs: whole replicas, or an equal share of each
        local = total // count
        return total % count == 0 and (local % gpus_per_replica == 0 or gpus_per_replica % local == 0)

    assert even(layout.count)
    assert not any(even(count) for count in range(-(-total // chips_per_host), layout.count))
    assert hosts(2, 8, 8).count == 2 and hosts(1, 12, 8).gpus_per_host == 6 and hosts(3, 4, 8).gpus_per_host == 4


def _run_on_host(script: str, tmp_path, **env: str) -> tuple[int, list[str], str]:
    """Run a launch script under /bin/sh with a `vllm` on PATH that prints its arguments, one a line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "vllm"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    path = tmp_path / "launch.sh"
    path.write_text(script)
    result = subprocess.run(["/bin/sh", str(path)], capture_output=True, text=True, timeout=30,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env})
    return result.returncode, result.stdout.splitlines(), result.stderr


def test_a_replica_over_two_hosts_runs_the_same_script_on_each_by_its_node_rank(tmp_path):
    (script,) = launch_files(_scenario("two-hosts-tp8-pp2"), "vllm").values()  # 16 x H200 of 8 a host
    code, head, _ = _run_on_host(script, tmp_path, NODE_RANK="0", HEAD_ADDR="10.0.0.1")
    assert code == 0
    assert head[:2] == ["serve", "meta-llama/Llama-3.1-405B-Instruct"]
    assert _values(head, "--nnodes") == ["2"] and _values(head, "--node-rank") == ["0"]
    assert _values(head, "--master-addr") == ["10.0.0.1"] and "--headless" not in head
    assert _values(head, "--api-server-count") == ["1"]
    code, other, _ = _run_on_host(script, tmp_path, NODE_RANK="1", HEAD_ADDR="10.0.0.1")
    assert code == 0
    assert _values(other, "--node-rank") == ["1"] and _values(other, "--master-addr") == ["10.0.0.1"]
    assert "--headless" in other and "--api-server-count" not in other  # vLLM refuses both together
    # without its rank the script stops before starting anything, and says what to set
    code, printed, error = _run_on_host(script, tmp_path, HEAD_ADDR="10.0.0.1")
    assert code != 0 and printed == [] and "NODE_RANK" in error


def test_replicas_over_hosts_are_one_data_parallel_deployment_of_nnodes():
    # 16 x H200 at TP4: 4 replicas, two on each of 2 hosts; vLLM infers each host's share from --nnodes
    (script,) = launch_files(_scenario("replicas-over-hosts"), "vllm").values()
    head, other = shell_words(script)
    for argv in (head, other):
        assert _values(argv, "--data-parallel-size") == ["4"] and _values(argv, "--nnodes") == ["2"]
    assert _values(other, "--node-rank") == ["$NODE_RANK"] and _values(other, "--master-addr") == ["$HEAD_ADDR"]
    assert "2 hosts, each running all 8 GPUs" in script


def test_a_gb200_replica_of_eight_takes_two_compute_trays():
    scenario = load_scenario("typical", {"deployment.chip": "gb200", "deployment.tp": 8})
    (script,) = launch_files(scenario, "vllm").values()
    assert "2 hosts, each running all 4 GPUs" in script  # 4 GPUs a compute tray (catalog/chips.toml)


def test_an_sglang_replica_over_two_hosts_is_one_command_by_its_node_rank(tmp_path):
    (script,) = launch_files(_scenario("two-hosts-tp8-pp2"), "sglang").values()
    (argv,) = shell_words(script)
    assert _values(argv, "--nnodes") == ["2"] and _values(argv, "--node-rank") == ["$NODE_RANK"]
    assert _values(argv, "--dist-init-addr") == ["${HEAD_ADDR}:25000"]
    assert '  --dist-init-addr "${HEAD_ADDR}:25000"' in script  # expanded by the shell, on each host
    # two PP stages over two hosts: one a host; three stages over two hosts SGLang cannot lay out
    assert sglang.over_hosts(make_plan(_scenario("two-hosts-tp8-pp2")), hosts(1, 16, 8))
    three_stages = load_scenario("typical", {"model.name": "llama-3.1-405b", "deployment.chips": 12,
                                             "deployment.tp": 4, "deployment.pp": 3})
    assert not sglang.over_hosts(make_plan(three_stages), hosts(1, 12, 8))
    assert "take 2 hosts of 8 (6 on each)" in launch_files(three_stages, "sglang")["launch-sglang.sh"]


@pytest.mark.parametrize(("engine", "name"), [("sglang", "replicas-over-hosts"), ("trtllm", "two-hosts-tp8-pp2"),
                                              ("trtllm", "replicas-over-hosts")])
def test_a_launch_written_for_one_host_says_when_the_deployment_needs_more(engine, name):
    written, settings = emit(make_plan(_scenario(name)), engine)
    (note,) = [n.text for n in settings.notes if n.setting == "deployment.chips"]
    assert note.startswith("the server pool's 16 GPUs take 2 hosts of 8 (8 on each); this file starts them on one")
    written, settings = emit(make_plan(_scenario("tp2-dp4")), engine)
    assert not [n for n in settings.notes if n.setting == "deployment.chips"]


def test_a_replica_larger_than_a_node_is_a_leader_worker_set_of_a_pod_a_node():
    documents = _k8s_documents(launch_files(_scenario("two-hosts-tp8-pp2"), "k8s")["k8s.yaml"])
    (group,) = [d for d in documents if d["kind"] == "LeaderWorkerSet"]
    (service,) = [d for d in documents if d["kind"] == "Service"]
    assert group["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and group["spec"]["replicas"] == 1
    template = group["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = (template[key]["spec"]["containers"][0] for key in ("leaderTemplate", "workerTemplate"))
    assert leader["resources"] == worker["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert _values(leader["command"], "--node-rank") == ["0"] and "--headless" not in leader["command"]
    assert _values(worker["command"], "--node-rank") == ["$(LWS_WORKER_INDEX)"] and "--headless" in worker["command"]
    for argv in (leader["command"], worker["command"]):
        assert _values(argv, "--nnodes") == ["2"] and _values(argv, "--master-addr") == ["$(LWS_LEADER_ADDRESS)"]
    assert "readinessProbe" in leader and "readinessProbe" not in worker and "ports" not in worker
    # requests reach the leaders alone: LeaderWorkerSet labels its pods with their index in the group
    assert service["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": group["metadata"]["name"],
                                           "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    # SGLang: every pod its rank from the group, all meeting at the leader
    scenario = load_scenario("typical", {**SCENARIOS["two-hosts-tp8-pp2"], "engine.scheduler": "prefill-first"})
    documents = _k8s_documents(launch_files(scenario, "k8s")["k8s.yaml"])
    (group,) = [d for d in documents if d["kind"] == "LeaderWorkerSet"]
    for template in _pod_templates(group):
        argv = template["spec"]["containers"][0]["command"]
        assert _values(argv, "--node-rank") == ["$(LWS_WORKER_INDEX)"]
        assert _values(argv, "--dist-init-addr") == ["$(LWS_LEADER_ADDRESS):25000"]


def test_a_pod_larger_than_a_node_is_noted_where_no_group_is_written():
    scenario = load_scenario("typical", {**SCENARIOS["two-hosts-tp8-pp2"], "engine.scheduler": "trtllm"})
    written, settings = emit(make_plan(scenario), "k8s")
    (note,) = [n.text for n in settings.notes if n.setting == "deployment.chips"]
    assert note.startswith("each pod asks for 16 GPUs, more than a node of 8 has")
    assert {d["kind"] for d in _k8s_documents(written["k8s.yaml"])} == {"ConfigMap", "Deployment", "Service"}
    written, settings = emit(make_plan(_scenario("replicas-over-hosts")), "k8s")  # pods of 4: any node holds one
    assert not [n for n in settings.notes if n.setting == "deployment.chips"]


@pytest.mark.parametrize("engine, flag, value", [("sglang", "--moe-a2a-backend", "deepep"),
                                                 ("vllm", "--all2all-backend", "deepep_low_latency")])
def test_all_to_all_dispatch_launches_the_engines_deepep_backend(engine, flag, value):
    base = {"model.name": "deepseek-v3", "deployment.tp": 8, "deployment.expert_parallel": True}
    (argv,) = shell_words(launch_files(load_scenario("typical", {**base, "deployment.moe_all_to_all": True}),
                                       engine)[f"launch-{engine}.sh"])
    assert _values(argv, flag) == [value]
    (argv,) = shell_words(launch_files(load_scenario("typical", base), engine)[f"launch-{engine}.sh"])
    assert flag not in argv  # the engine's default gathers and reduce-scatters, as simulated


def test_vllm_says_a_disaggregated_pools_engines_of_an_moe_model_step_together():
    # docs/serving/data_parallel_deployment.md: the experts form a (DP x TP) tensor-parallel group. A pool is
    # one server (its replicas' KV transfers are the connector's), so the script says where it differs.
    pools = {"model.name": "qwen3-235b-a22b", "deployment.chips": 8, "deployment.tp": 2,
             "deployment.prefill_replicas": 2}
    script = launch_files(load_scenario("typical", pools), "vllm")["launch-vllm.sh"]
    assert ("the 2 data-parallel engines of one vLLM server step together for their expert layers, tensor-parallel "
            "over all its chips; the simulation steps its 2 replicas apart, each with every expert") in script
    dense = load_scenario("typical", {"deployment.chips": 8, "deployment.tp": 2, "deployment.prefill_replicas": 2})
    assert "step together" not in launch_files(dense, "vllm")["launch-vllm.sh"]


def test_a_vllm_replica_whose_kv_cache_holds_less_than_the_model_s_context_is_told_its_max_model_len():
    # Llama-3.1-70B FP8 on one H100: its cache holds requests of some 11,000 tokens, not the model's 131,072,
    # and vLLM refuses to start with a max_model_len its cache cannot hold.
    scenario = load_scenario("typical", {"deployment.chip": "h100", "deployment.chips": 1, "deployment.tp": 1})
    plan = make_plan(scenario)
    assert plan.context_tokens is not None and 5_000 < plan.context_tokens < 131_072
    assert plan.context_tokens == scenario.engine.longest_request_tokens(build_deployment(scenario).kv_capacity_tokens)
    (script,) = launch_files(scenario, "vllm").values()
    (words,) = shell_words(script)
    assert words[words.index("--max-model-len") + 1] == str(plan.context_tokens)
    # Eight H200s hold the whole context: no flag.
    (script,) = launch_files(load_scenario("typical"), "vllm").values()
    assert "--max-model-len" not in shell_words(script)[0]
