"""The `jepa` root command: a lazy group, so `jepa --help` and completion never import JAX."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import signal
import sys
import threading

import click

from jepa_cli import __version__
from jepa_cli.cli.compile_cache import use_compilation_cache
from jepa_cli.errors import (InputError, JepaError, Terminated, completed_mark, completed_since, ignore_signals,
                             out_of_memory, raise_if_signalled_since, raise_on_signals, received_signal, signal_mark,
                             storage_failure)

# name -> (module, one-line summary). Modules are imported only when their command runs, so the
# summaries live here: `jepa --help` must not import a subcommand's dependencies.
COMMANDS: dict[str, tuple[str, str]] = {
    "ingest": ("jepa_cli.cli.ingest", "Put images, video clips, audio or arrays into a dataset directory (zarr v3)."),
    "mask": ("jepa_cli.cli.mask", "Sample JEPA context/target masks; write, show, picture or summarize them."),
    "info": ("jepa_cli.cli.info", "Describe a dataset, mask file, embedding set or run."),
    "probe": ("jepa_cli.cli.probe", "Score frozen features with a linear, k-NN or attentive probe."),
    "encode-latents": ("jepa_cli.cli.encode", "Encode a dataset with a trained encoder into a latent dataset."),
    "train": ("jepa_cli.cli.train", "Pretrain an encoder on a dataset (I-JEPA by default) with the official recipe."),
    "ema-inspect": ("jepa_cli.cli.ema_inspect", "Show the EMA momentum schedule of a run and how far the EMA is from the online weights."),
    "sample": ("jepa_cli.cli.sample", "Draw samples from a flow or diffusion run into a dataset."),
    "import-checkpoint": ("jepa_cli.cli.import_checkpoint",
                          "Convert a published I-JEPA, V-JEPA or Audio-JEPA checkpoint into a run directory."),
    "export": ("jepa_cli.cli.export", "Export a run's weights in the official layout, for PyTorch."),
    "fd": ("jepa_cli.cli.fd", "Frechet distance, precision, recall, density and coverage between two datasets' features."),
    "plot": ("jepa_cli.cli.plot",
             "Plot training curves of one or more runs against the step, overlaid (needs the plot extra)."),
    "runs": ("jepa_cli.cli.runs",
             "Compare runs: one table per objective of the config keys that differ, step, final loss, last probe."),
    "env": ("jepa_cli.cli.env",
            "Show the backend, devices, processes and library versions that `jepa train` would use."),
    "completion": ("jepa_cli.cli.completion", "Print the shell completion script for bash, zsh or fish."),
}


class _Stopped(Exception):
    """A signal ended the command; carries the exit code (not a KeyboardInterrupt, so that click's
    own handler, which prints a blank line to stderr, never sees it)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _quiet_signal_exceptions(unraisable) -> None:
    """sys.unraisablehook: a SIGINT/SIGTERM whose exception landed in a callback Python cannot raise
    from (JAX's garbage-collection hook, a __del__) prints nothing; the signal is remembered and ends
    the command at its next commit point (errors.raise_if_signalled_since). Anything else is printed
    as Python would."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):  # Terminated is one too
        return
    sys.__unraisablehook__(unraisable)


class JepaGroup(click.Group):
    """Loads subcommands on demand and turns every error into one `jepa: error:` line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[name][0])
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        """The subcommand, once its JEPA_<COMMAND>_* variables are known to name its options
        (cli/declared.py check_variables; not for --help, nor while the shell completes)."""
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None and not ctx.resilient_parsing and not set(rest) & set(ctx.help_option_names):
            from jepa_cli.cli.declared import check_variables

            def prefix(subcommand: str) -> str:
                return f"{ctx.auto_envvar_prefix}_{subcommand.upper().replace('-', '_')}_"

            check_variables(command, prefix(name), os.environ, tuple(map(prefix, COMMANDS)))
        return name, command, rest

    def invoke(self, ctx: click.Context):
        mark = signal_mark()
        try:
            result = super().invoke(ctx)
            raise_if_signalled_since(mark)  # a signal a library callback swallowed still ends the command
            return result
        except Terminated:
            raise _Stopped(143) from None
        except KeyboardInterrupt:
            raise _Stopped(130) from None
        except Exception:
            signum = received_signal(mark)
            if signum is not None:  # e.g. an import interrupted inside a C extension
                raise _Stopped(128 + signum) from None
            self.failed_command = ctx.invoked_subcommand  # for main's last line of defence
            raise

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        use_compilation_cache(os.environ)
        # SIGTERM ends every command like Ctrl-C (cleanup runs, exit 143); `jepa train` installs its
        # own handler while it trains, to finish the step and save first.
        sys.unraisablehook = _quiet_signal_exceptions
        raise_on_signals()
        completed = completed_mark()
        _report_late_signals(completed)
        self.failed_command = None
        try:
            with quiet_libraries():
                rv = super().main(args=args, prog_name=prog_name or "jepa", complete_var=complete_var,
                                  standalone_mode=False, **extra)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except _Stopped as exc:
            done = completed_since(completed)  # the signal came after these were in place: say they are whole
            _fail(("terminated (SIGTERM)" if exc.code == 143 else "interrupted")
                  + (f" after {', '.join(done)} was written in full" if done else ""), exc.code)
        except click.Abort:
            _fail("interrupted", 130)
        except click.ClickException as exc:
            if isinstance(exc, click.BadParameter) and exc.param is not None and exc.ctx is not None \
                    and exc.ctx.get_parameter_source(exc.param.name) is click.core.ParameterSource.ENVIRONMENT:
                from jepa_cli.cli.declared import variable

                exc.param_hint = variable(exc.ctx, exc.param)  # a variable's bad value names the variable
            _fail(exc.format_message(), 2)
        except JepaError as exc:
            if os.environ.get("JEPA_DEBUG") == "1":
                raise
            _fail(str(exc), exc.exit_code)
        except Terminated:
            _fail("terminated (SIGTERM)", 143)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, no traceback
            if os.environ.get("JEPA_DEBUG") == "1":
                raise
            refused = storage_failure(exc) or jax_environment_problem(exc)  # for every command
            if refused is not None:
                _fail(refused, 2)
            command = " ".join(filter(None, ("jepa", self.failed_command)))
            if out_of_memory(exc):  # the user fixes it, as a full disk (exit 2)
                _fail(f"{command} ran out of memory (the machine's, or a limit such as ulimit -v): give it "
                      "a smaller batch (--batch-size) or more memory", 2)
            what = " ".join(str(exc).split())
            _fail(f"internal error in {command}{': ' + what if what else ''} "
                  "(rerun with JEPA_DEBUG=1 for the traceback)", 1)
        if isinstance(rv, int) and rv:
            sys.exit(rv)
        sys.exit(0)


NO_JAX_COMMANDS = frozenset({"completion"})  # commands that never start JAX: no environment check for them
# XLA_FLAGS values XLA is known to read (the simulated CPU devices of the tests and of docs/distributed.md):
# no child process to check them
XLA_FLAGS_KNOWN = re.compile(r"--xla_force_host_platform_device_count=\d+")
# glog's fatal and error lines: "F1205 05:27:07.904835 6263 parse_flags_from_env.cc:234] Unknown flag ..."
_GLOG_LINE = re.compile(r"^([EF])\d{4} [\d:.]+\s+\d+ \S+\] (.*)$", re.M)


def xla_flags_problem(env) -> str | None:
    """Why XLA would refuse `env`'s XLA_FLAGS, in XLA's words, or None. XLA reads XLA_FLAGS when JAX
    first compiles and ends the process on a flag it does not know or a value it cannot read: a C++
    fatal error, with no Python exception to turn into one line, after a hundred lines of flag help.
    So a child process with the same environment reads them first (about 0.5 s, only for flags other
    than XLA_FLAGS_KNOWN). A child that fails in another way (no jaxlib) says nothing here: the
    command itself reports that."""
    flags = (env.get("XLA_FLAGS") or "").strip()
    if not flags or all(XLA_FLAGS_KNOWN.fullmatch(flag) for flag in flags.split()):
        return None
    import subprocess

    try:
        child = subprocess.run([sys.executable, "-c", "from jaxlib import _jax; _jax.CompileOptions()"],
                               env=dict(env), capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = _GLOG_LINE.findall(child.stderr.decode("utf-8", "replace"))
    if child.returncode == 0 or not any(level == "F" for level, _ in lines):
        return None
    reasons = [text for _, text in lines if not text.startswith("Check failed")]  # the cause before the abort
    return " ".join((reasons or [text for _, text in lines])[0].split())


def jax_environment_problem(exc: BaseException) -> str | None:
    """The one line for JAX refusing an environment variable while it is imported (a JAX_* variable
    that is not of its flag's type, e.g. JAX_NUM_CPU_DEVICES=abc: a ValueError from jax/_src/config.py),
    naming the variable; None for any other exception."""
    if not isinstance(exc, ValueError):
        return None
    tb, variable = exc.__traceback__, None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename.replace(os.sep, "/").endswith("jax/_src/config.py"):
            name = frame.f_locals.get("varname") or frame.f_locals.get("name")
            if isinstance(name, str) and name.upper() in os.environ:
                variable = name.upper()
        tb = tb.tb_next
    if variable is None:
        return None
    return (f"{variable}={os.environ[variable]!r}: JAX cannot read this environment variable "
            f"({' '.join(str(exc).split())}); fix or unset it")


class _StderrLog(logging.Handler):
    """Writes log records to the current sys.stderr, looked up per record (click's test runner swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging must never end a command
            self.handleError(record)


@contextlib.contextmanager
def quiet_libraries():
    """Silences what JAX, XLA, orbax, absl and Python warnings would write to stderr, for the length of
    a command (then restores the logging state): an error must be one line, and their messages
    ("An NVIDIA GPU may be present ...", orbax INFO lines, DeprecationWarnings) would add lines around
    it. `-v` lets warnings through, `-vv` info (cli/common.py, output_options)."""
    # XLA's C++ logging reads this when jaxlib loads: 2 keeps its errors, drops info and warnings
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    root = logging.getLogger()
    level = root.level
    handler = _StderrLog()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.CRITICAL)  # a library's ERROR record precedes the exception our line reports
    logging.captureWarnings(True)  # warnings.warn -> the "py.warnings" logger, silenced with the rest
    try:
        yield
    finally:
        logging.captureWarnings(False)
        root.setLevel(level)
        root.removeHandler(handler)


def _fail(message: str, code: int) -> None:
    from jepa_cli.data.store import utf8_text

    line = utf8_text(" ".join(str(message).split()))  # one line of valid UTF-8, whatever the message held
    click.echo(f"jepa: error: {line}", err=True)
    _late_signals.update(since=None, code=code if code in (130, 143) else None)  # said: nothing more to report
    _quiet_stderr_at_exit()
    sys.exit(code)


# What the last atexit callback does: report the signals received after `since` (None: a line was already
# said), and end a process that a signal stopped (`code`) without tearing JAX down.
_late_signals: dict = {"since": None, "code": None, "registered": False}


def _report_late_signals(completed: int) -> None:
    """A SIGINT/SIGTERM arriving while the interpreter shuts down (Python threads joined, atexit callbacks)
    raises where Python ignores the exception, and once Python has restored the default handlers it kills
    the process without a line. So an atexit callback registered before any library's (it runs last)
    ignores both signals from then on and reports one received after the command's outcome: its line, naming the
    outputs written in full since `completed`, and exit 128 + N. A process a signal stopped then ends
    at once, without the teardown of JAX's runtime, whose threads may still be running. Only in the
    real process (in-process callers keep theirs)."""
    _late_signals.update(since=signal_mark(), code=None)
    if _late_signals["registered"] or sys.stderr is not sys.__stderr__ \
            or threading.current_thread() is not threading.main_thread():
        return
    _late_signals["registered"] = True
    import atexit

    def last_word() -> None:
        ignore_signals()  # the outcome is settled: the teardown is not interrupted
        since, code = _late_signals["since"], _late_signals["code"]
        signum = received_signal(since) if since is not None else None
        if signum is not None:
            done = completed_since(completed)
            with contextlib.suppress(OSError, ValueError):
                click.echo("jepa: error: " + ("terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted")
                           + (f" after {', '.join(done)} was written in full" if done else ""), err=True)
            code = 128 + signum
        if code is not None:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            os._exit(code)

    atexit.register(last_word)


_stderr_closed_at_exit = False


def _quiet_stderr_at_exit() -> None:
    """After the error line, nothing else may reach stderr: a library's writes abandoned by the failure
    (orbax's and TensorStore's, after a full disk) can still end while the interpreter shuts down, when
    Python prints their tracebacks with its default hooks, past every filter. So, at exit, the process's
    stderr goes to /dev/null. Only for the real process (in-process callers keep their stderr)."""
    global _stderr_closed_at_exit
    if _stderr_closed_at_exit or sys.stderr is not sys.__stderr__:
        return
    _stderr_closed_at_exit = True
    import atexit

    def close_stderr() -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)

    atexit.register(close_stderr)


@click.group(cls=JepaGroup, context_settings={"auto_envvar_prefix": "JEPA", "help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="jepa")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """jepa: joint-embedding predictive self-supervised learning from the shell.

    Subcommands exchange zarr v3 arrays and orbax checkpoints on disk.
    Results go to stdout (--json for one JSON object), logs and progress to stderr.
    """
    # JAX has not started in a real `jepa` process yet; one that already loaded it (a caller in Python)
    # read its XLA_FLAGS then, and lived.
    if ctx.invoked_subcommand not in NO_JAX_COMMANDS and "jaxlib._jax" not in sys.modules:
        problem = xla_flags_problem(os.environ)
        if problem is not None:
            raise InputError(f"XLA_FLAGS={os.environ['XLA_FLAGS']!r}: XLA refuses it ({problem}); fix or unset "
                                 "XLA_FLAGS")


def main() -> None:
    cli.main()
