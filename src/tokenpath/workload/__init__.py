"""What requests look like: token lengths, arrival times, concurrency and recorded traces."""

from tokenpath.workload.generate import fingerprint_inputs, generate
from tokenpath.workload.requests import Requests
from tokenpath.workload.spec import ArrivalSpec, LengthSpec, TraceSpec, WorkloadSpec
from tokenpath.workload.traces import read_trace, write_trace

__all__ = [
    "ArrivalSpec",
    "LengthSpec",
    "Requests",
    "TraceSpec",
    "WorkloadSpec",
    "fingerprint_inputs",
    "generate",
    "read_trace",
    "write_trace",
]
