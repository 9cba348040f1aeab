"""`jepa env`."""

from __future__ import annotations

import click

from jepa_cli.cli.common import emit, output_options


@click.command("env")
@output_options
def command(as_json: bool, verbose: int, quiet: bool) -> None:
    """Show the backend, devices, processes and library versions that `jepa train` would use.

    Also which of the variables that reach s3:// and gs:// buckets are set (never their values).

    \b
    Examples:
      jepa env
      jepa env --json | jq .devices
      XLA_FLAGS=--xla_force_host_platform_device_count=8 jepa env   # 8 simulated CPU devices
    """
    import os

    import jax

    from jepa_cli.cli.compile_cache import compilation_cache_off_reason
    from jepa_cli.training.distributed import environment_report

    from jepa_cli.data.urls import variables_set

    report = environment_report()
    report["bucket_variables"] = variables_set()  # which are set, never their values (credentials)
    # what JAX uses (a user's own JAX_COMPILATION_CACHE_DIR included), and why there is none
    cache = jax.config.jax_compilation_cache_dir if jax.config.jax_enable_compilation_cache else None
    unusable = cache_unusable_reason(cache) if cache else None
    report["compilation_cache"] = None if unusable else cache or None
    if unusable:
        report["compilation_cache_off"] = unusable
    elif not cache:
        report["compilation_cache_off"] = compilation_cache_off_reason(os.environ) or "JAX's cache is off"

    def human(r: dict) -> None:
        from jepa_cli.cli.common import print_mapping

        flat = {k: v for k, v in r.items() if k not in ("devices", "versions", "compilation_cache_off",
                                                        "bucket_variables")}
        flat["bucket_variables"] = ", ".join(name for name, on in r["bucket_variables"].items() if on) or "none set"
        flat["compilation_cache"] = r["compilation_cache"] or f"off: {r['compilation_cache_off']}"
        flat["devices"] = ", ".join(f"{d['platform']}:{d['id']}" for d in r["devices"][:8]) + (
            f", ... ({len(r['devices'])})" if len(r["devices"]) > 8 else "")
        flat.update({name: version or "not installed" for name, version in r["versions"].items()})
        print_mapping(flat)

    emit(report, as_json, human)


def cache_unusable_reason(directory: str) -> str | None:
    """Why JAX cannot keep compiled programs in `directory` (it then compiles every time without a
    word), or None: a path that exists but is not a directory, or one it cannot write."""
    import os

    if os.path.lexists(directory) and not os.path.isdir(directory):
        return f"{directory} is not a directory"
    existing = directory
    while existing and not os.path.exists(existing):  # JAX creates the missing folders
        existing = os.path.dirname(existing.rstrip("/")) or "."
    if os.path.isdir(existing) and not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    if not os.path.isdir(existing):
        return f"{existing} is not a directory"
    return None
