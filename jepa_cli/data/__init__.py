"""Datasets on disk: zarr v3 groups written and read with TensorStore (see docs/formats.md)."""
