"""The persistent XLA compilation cache of `jepa` commands: where it lives, when it is off, and how
JAX is told (through the environment variables it reads when imported, so `jepa --help` imports no JAX)."""

from __future__ import annotations

import os
import re


CACHE_MAX_BYTES = 2 << 30  # the persistent XLA cache evicts least-recently-used entries past 2 GiB
# JAX's default keeps only programs that took over 1 s to compile; a step's small helpers (the mask
# samplers, the mask-size probe, init: 0.8-1 s each for a tiny model) are worth keeping too. Not the
# dozens of one-operation programs (20-50 ms each) that eager JAX code compiles: with a size cap, every
# new entry makes JAX stat and read every entry already there (jax/_src/lru_cache.py, 0.33 s per write
# at 2,600 entries here), so keeping them all cost more than it saved once the cache filled up.
CACHE_MIN_COMPILE_SECONDS = 0.05


def simulated_cpu_devices(env) -> int:
    """The CPU devices one process is asked to simulate (XLA_FLAGS' --xla_force_host_platform_device_count
    or JAX_NUM_CPU_DEVICES); 1 when neither is set."""
    match = re.search(r"--xla_force_host_platform_device_count=(\d+)", env.get("XLA_FLAGS", ""))
    counts = [int(match.group(1))] if match else []
    if (env.get("JAX_NUM_CPU_DEVICES") or "").strip().isdigit():
        counts.append(int(env["JAX_NUM_CPU_DEVICES"]))
    return max(counts, default=1)


def compilation_cache_dir(env) -> str | None:
    """Where compiled XLA programs persist between commands: $JEPA_CACHE_DIR, by default
    $XDG_CACHE_HOME/jepa/xla (~/.cache/jepa/xla); None when JEPA_CACHE_DIR is off, 0 or empty, and
    when one process simulates several CPU devices: a step whose all-reduces were loaded from the cache
    then deadlocked now and then (two all-reduces in flight, each missing the device that waits in the
    other, until XLA aborts the process after 40 s): 6 of 9 runs of tests/test_multiprocess.py with a
    warm cache, 0 of 4 without (jaxlib 0.10.2; docs/cli-conventions.md)."""
    if simulated_cpu_devices(env) > 1:
        return None
    value = env.get("JEPA_CACHE_DIR")
    if value is not None:
        return None if value.strip().lower() in ("", "0", "off", "false", "none") else value
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jepa", "xla")


def compilation_cache_off_reason(env) -> str | None:
    """Why `jepa` keeps no compilation cache under `env` (None when compilation_cache_dir gives one)."""
    devices = simulated_cpu_devices(env)
    if devices > 1:
        return f"{devices} simulated CPU devices in one process (a cached step's all-reduces can deadlock)"
    if compilation_cache_dir(env) is None:
        return f"JEPA_CACHE_DIR={env.get('JEPA_CACHE_DIR', '')!r}"
    return None


def use_compilation_cache(env) -> None:
    """Turns JAX's persistent compilation cache on for this process and its children, in
    compilation_cache_dir(env), through the environment variables JAX reads when it is imported (so
    `jepa --help` still imports no JAX). A second run of the same configuration then loads its step
    instead of compiling it."""
    directory = compilation_cache_dir(env)
    if directory is not None:
        hand_cache_to_jax(env, directory)


def hand_cache_to_jax(env, directory: str) -> None:
    """Sets JAX's cache variables in `env`: `directory`, the size cap (which makes JAX guard the cache
    with a file lock, so concurrent commands share it safely) and the compile-time threshold. A user's
    own settings win."""
    env.setdefault("JAX_COMPILATION_CACHE_DIR", directory)
    env.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(CACHE_MAX_BYTES))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", str(CACHE_MIN_COMPILE_SECONDS))
