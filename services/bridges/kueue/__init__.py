"""The Kueue bridge: an AdmissionCheck controller backed by gpualloc (`gpualloc-kueue`)."""
