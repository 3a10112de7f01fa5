"""Compute layer: how long one engine step takes on one chip, as a roofline over the model's ops."""

from tokenpath.compute.chip import ChipSpec, list_chips, load_chip
from tokenpath.compute.model import list_models, load_model
from tokenpath.compute.model_spec import ModelSpec
from tokenpath.compute.precision import PRECISION_BYTES
from tokenpath.compute.roofline import ComputeModel, OpCost

__all__ = [
    "PRECISION_BYTES",
    "ChipSpec",
    "ComputeModel",
    "ModelSpec",
    "OpCost",
    "list_chips",
    "list_models",
    "load_chip",
    "load_model",
]
