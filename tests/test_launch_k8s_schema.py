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


@pytest.mark.parametrize("name", SCENARIOS)  # TP x DP, PP, disaggregated pools, TensorRT-LLM's ConfigMaps, ...
def test_every_manifest_object_meets_the_kubernetes_schema(name):
    documents = _documents(name)
    kinds = {document["kind"] for document in documents}
    assert kinds >= {"Deployment", "Service"}
    assert ("ConfigMap" in kinds) == name.startswith("trtllm")
    newest = kubernetes_validate.utils.major_minor(kubernetes_validate.latest_version())
    for document in documents:
        assert _validate(document) == newest


@pytest.mark.parametrize(("path", "value"), [
    (("spec", "replicas"), "4"),                         # an integer field given as a string
    (("spec", "template", "spec", "gpus"), 2),            # a field no PodSpec has (strict)
    (("spec", "template", "spec", "containers"), "vllm"),  # a list given as a string
])
def test_a_broken_manifest_fails_the_schema(path, value):
    deployment = copy.deepcopy(next(d for d in _documents("tp2-dp4") if d["kind"] == "Deployment"))
    _validate(deployment)
    parent = deployment
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(deployment)
