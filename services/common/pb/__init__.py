"""Conversions between the DRA model (services.common.dra.model) and its protobuf messages.

The one place where model values and `gpualloc.common.v1` messages meet, so that both services'
servicers translate the shared DRA shapes identically; see dra_mapping.py.
"""
