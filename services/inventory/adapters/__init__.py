"""The inventory's edges: grpc/ (servicer, protobuf mappings), store/ (repositories), sources/
(ResourceSlices, nvidia-smi, NVML, topology matrices, report JSON).

They may import the app and core rooms.
"""
