"""`tokenpath launch --engine k8s`: every object the manifest holds validates against the Kubernetes
OpenAPI schema of the newest Kubernetes version kubernetes-validate ships, strictly (a field the API
does not define is an error), offline."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from test_launch import SCENARIOS, _k8s_documents, _scenario
from tokenpath.launch import launch_files


def _validate(document: dict) -> str:
    """The Kubernetes version whose schema `document` meets; raises kubernetes_validate.ValidationError."""
    return kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def _documents(name: str) -> list[dict]:
    return _k8s_documents(launch_files(_scenario(name), "k8s")["k8s.yaml"])


# LeaderWorkerSet v1's fields (kubernetes-sigs/lws, api/leaderworkerset/v1/leaderworkerset_types.go:
# LeaderWorkerSetSpec, LeaderWorkerTemplate, RestartPolicyType), which no Kubernetes schema holds: a custom
# resource. Its pod templates are core PodTemplateSpecs, checked as the schema's PodTemplate.
LWS_SPEC = {"replicas", "leaderWorkerTemplate", "rolloutStrategy", "startupPolicy", "networkConfig"}
LWS_TEMPLATE = {"leaderTemplate", "workerTemplate", "size", "restartPolicy", "subGroupPolicy", "volumeClaimTemplates",
                "persistentVolumeClaimRetentionPolicy"}
LWS_RESTART = {"Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"}


def _validate_leader_worker_set(document: dict) -> str:
    """The Kubernetes version whose schema its pod templates meet, after checking its own fields."""
    assert document["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and set(document) == {
        "apiVersion", "kind", "metadata", "spec"}
    spec = document["spec"]
    group = spec["leaderWorkerTemplate"]
    assert set(spec) <= LWS_SPEC and set(group) <= LWS_TEMPLATE and group["restartPolicy"] in LWS_RESTART
    assert isinstance(spec["replicas"], int) and isinstance(group["size"], int) and group["size"] >= 1
    name = {"name": document["metadata"]["name"]}
    versions = {_validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": name, "template": group[key]})
                for key in ("leaderTemplate", "workerTemplate")}
    _validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": document["metadata"]})  # its metadata
    (version,) = versions
    return version


@pytest.mark.parametrize("name", SCENARIOS)  # TP x DP, PP, disaggregated pools, TensorRT-LLM's ConfigMaps, ...
def test_every_manifest_object_meets_the_kubernetes_schema(name):
    documents = _documents(name)
    kinds = {document["kind"] for document in documents}
    assert "Service" in kinds and len(kinds & {"Deployment", "LeaderWorkerSet"}) == 1
    # the replicas larger than a node: TP8 x PP2, and TP16 for sixteen expert ranks
    assert ("LeaderWorkerSet" in kinds) == (name in ("two-hosts-tp8-pp2", "ep-all-to-all"))
    assert ("ConfigMap" in kinds) == name.startswith("trtllm")
    newest = kubernetes_validate.utils.major_minor(kubernetes_validate.latest_version())
    for document in documents:
        if document["kind"] == "LeaderWorkerSet":
            assert _validate_leader_worker_set(document) == newest
        else:
            assert _validate(document) == newest


@pytest.mark.parametrize(("path", "value"), [
    (("spec", "replicas"), "4"),                         # an integer field given as a string
    (("spec", "template", "spec", "gpus"), 2),            # a field no PodSpec has (strict)
    (("spec", "template", "spec", "containers"), "vllm"),  # a list given as a string
])
def test_a_broken_manifest_fails_the_schema(path, value):
    deployment = next(d for d in _documents("tp2-dp4") if d["kind"] == "Deployment")
    _validate(deployment)
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(_broken(deployment, path, value))


def _broken(document: dict, path: tuple, value: object) -> dict:
    """A copy of `document` with the field at `path` set to `value`."""
    broken = copy.deepcopy(document)
    parent = broken
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return broken


@pytest.mark.parametrize(("path", "value"), [
    (("spec", "leaderWorkerTemplate", "restartPolicy"), "Always"),               # not a LeaderWorkerSet policy
    (("spec", "leaderWorkerTemplate", "workerTemplate", "spec", "gpus"), 2),     # a field no PodSpec has
    (("spec", "leaderWorkerTemplate", "groups"), 2),                             # a field the group has not
])
def test_a_broken_leader_worker_set_fails(path, value):
    group = next(d for d in _documents("two-hosts-tp8-pp2") if d["kind"] == "LeaderWorkerSet")
    _validate_leader_worker_set(group)
    with pytest.raises((kubernetes_validate.ValidationError, AssertionError)):
        _validate_leader_worker_set(_broken(group, path, value))
