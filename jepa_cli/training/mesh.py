"""The device mesh (`data`, `fsdp`), the parameter sharding rule and the batch sharding."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from jepa_cli.errors import InputError

AXES = ("data", "fsdp")


def parse_mesh(spec: str | dict[str, int]) -> dict[str, int]:
    """'data=-1,fsdp=1' -> {'data': -1, 'fsdp': 1}; every axis defaults to 1; -1 takes the rest."""
    if isinstance(spec, dict):
        items = dict(spec)
    else:
        items = {}
        for part in str(spec).replace(" ", "").split(","):
            if not part:
                continue
            name, sep, value = part.partition("=")
            if not sep:
                raise InputError(f"--mesh: expected NAME=SIZE such as data=-1,fsdp=1, got {part!r}")
            try:
                items[name] = int(value)
            except ValueError:
                raise InputError(f"--mesh: axis {name!r} needs an integer size, got {value!r}") from None
    unknown = sorted(set(items) - set(AXES))
    if unknown:
        raise InputError(f"--mesh: unknown axis {unknown[0]!r} (axes: {', '.join(AXES)})")
    sizes = {axis: int(items.get(axis, 1)) for axis in AXES}
    if any(v == 0 or v < -1 for v in sizes.values()):
        raise InputError(f"--mesh: axis sizes must be positive or -1, got {spec}")
    if sum(v == -1 for v in sizes.values()) > 1:
        raise InputError(f"--mesh: at most one axis may be -1, got {spec}")
    return sizes


def resolve_mesh_shape(spec: str | dict[str, int], num_devices: int) -> dict[str, int]:
    """Fills the -1 axis and checks the mesh fits the devices."""
    sizes = parse_mesh(spec)
    fixed = int(np.prod([v for v in sizes.values() if v != -1]))
    if fixed > num_devices:
        raise InputError(f"--mesh {format_mesh(sizes)} needs {fixed} devices, only {num_devices} available")
    for axis, v in sizes.items():
        if v == -1:
            if num_devices % fixed:
                raise InputError(f"--mesh: {num_devices} devices do not divide into axes of size {fixed}")
            sizes[axis] = num_devices // fixed
    total = int(np.prod(list(sizes.values())))
    if total > num_devices:
        raise InputError(f"--mesh {format_mesh(sizes)} needs {total} devices, only {num_devices} available")
    return sizes


def format_mesh(sizes: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sizes.items())


def make_mesh(spec: str | dict[str, int] = "data=-1,fsdp=1", devices: list | None = None) -> Mesh:
    """A Mesh over (data, fsdp) from a spec, on the first data*fsdp devices. jax.make_mesh orders them by
    the physical topology on TPU and GPU (neighbours on the fsdp axis); the axes stay Auto (shardings
    by annotation, as every jit here is written), not make_mesh's default Explicit."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = resolve_mesh_shape(spec, len(devices))
    n = sizes["data"] * sizes["fsdp"]
    return jax.make_mesh((sizes["data"], sizes["fsdp"]), AXES, axis_types=(AxisType.Auto,) * len(AXES),
                         devices=devices[:n])


def leaf_spec(shape: tuple[int, ...], fsdp: int) -> P:
    """Shard along the largest axis divisible by the fsdp size; replicate when none is (or fsdp=1)."""
    if fsdp <= 1 or not shape:
        return P()
    candidates = [(size, -i) for i, size in enumerate(shape) if size % fsdp == 0 and size >= fsdp]
    if not candidates:
        return P()
    _, neg_axis = max(candidates)
    spec: list[Any] = [None] * len(shape)
    spec[-neg_axis] = "fsdp"
    return P(*spec)


def state_shardings(mesh: Mesh, abstract_tree: Any) -> Any:
    """NamedShardings for every leaf of a (shape-only) pytree by the fsdp rule."""
    fsdp = mesh.shape["fsdp"]
    return jax.tree.map(lambda x: NamedSharding(mesh, leaf_spec(tuple(np.shape(x)), fsdp)), abstract_tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """The leading (batch) axis split over data x fsdp."""
    return NamedSharding(mesh, P(AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def check_batch(batch_size: int, mesh: Mesh, grad_accum: int = 1) -> None:
    """The global batch must split evenly over the devices (per micro-batch) and the processes."""
    dp = data_parallel_size(mesh)
    if batch_size <= 0:
        raise InputError(f"--batch-size must be positive, got {batch_size}")
    if grad_accum <= 0:
        raise InputError(f"--grad-accum must be positive, got {grad_accum}")
    if batch_size % grad_accum:
        raise InputError(f"--batch-size {batch_size} is not divisible by --grad-accum {grad_accum}")
    if batch_size % dp:
        raise InputError(f"--batch-size {batch_size} is not divisible by the data-parallel size {dp} "
                         f"(mesh {format_mesh(dict(mesh.shape))})")
    if (batch_size // grad_accum) % dp:
        raise InputError(f"micro-batch {batch_size // grad_accum} (--batch-size / --grad-accum) is not divisible "
                         f"by the data-parallel size {dp}")
    if batch_size % jax.process_count():
        raise InputError(f"--batch-size {batch_size} is not divisible by the {jax.process_count()} processes")
