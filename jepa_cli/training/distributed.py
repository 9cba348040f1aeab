"""Multi-process start-up: jax.distributed.initialize under an explicit or detected launch."""

from __future__ import annotations

import os

from jepa_cli.errors import InputError


def multi_process_env() -> bool:
    """True when the environment looks like a multi-process launch that JAX can auto-detect: an explicit
    JAX coordinator, a Cloud TPU slice listing more than one host, or SLURM / Open MPI with more than
    one task."""
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return True
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if len([h for h in hosts.split(",") if h]) > 1:
        return True
    for name in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
        try:
            if int(os.environ.get(name, "1")) > 1:
                return True
        except ValueError:
            pass
    return False


_initialized = False


def initialize(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None) -> bool:
    """Calls jax.distributed.initialize once when asked (--coordinator ...) or when the environment
    is a multi-process launch; returns whether it did."""
    global _initialized
    if _initialized:
        return True
    explicit = coordinator is not None or num_processes is not None or process_id is not None
    if explicit and (coordinator is None or num_processes is None or process_id is None):
        raise InputError("--coordinator, --num-processes and --process-id go together")
    if not explicit and not multi_process_env():
        return False
    import jax

    # No persistent compilation cache across processes: a program cached by a single-process run
    # of the same shapes was loaded by one process of a 2-process CPU job and not by the other,
    # and their collectives no longer matched (gloo "Received data size doesn't match").
    jax.config.update("jax_enable_compilation_cache", False)
    if explicit:
        if not 0 <= process_id < num_processes:
            raise InputError(f"--process-id {process_id} is not in [0, {num_processes})")
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    else:
        jax.distributed.initialize()
    _initialized = True
    return True


VERSIONED = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "tensorstore", "grain", "numpy")


def environment_report() -> dict:
    """What `jepa train` would run on: JAX's backend, this process's devices and the slice's, the
    process count, the CPU cores, and the versions of the libraries a run depends on (from package
    metadata; `None` for one that is not installed)."""
    import importlib.metadata
    import platform

    import jax

    versions = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    try:
        devices = jax.devices()
    except RuntimeError as exc:  # JAX_PLATFORMS names a backend this machine cannot start
        raise InputError(f"JAX cannot start its backend ({' '.join(str(exc).split())[:300]})") from None
    return {"backend": jax.default_backend(), "device_kind": devices[0].device_kind,
            "device_count": len(devices), "local_device_count": jax.local_device_count(),
            "process_count": jax.process_count(), "process_index": jax.process_index(),
            "cpu_cores": os.cpu_count(), "multi_process_env": multi_process_env(),
            "devices": [{"id": d.id, "platform": d.platform, "kind": d.device_kind, "process_index": d.process_index}
                        for d in devices],
            "versions": versions}
