"""vLLM's own ``run_headless`` run in a worker thread up to its engine start: the driver of the
``vllm.serve_signals_main_thread`` self-check and its tests."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

#: A one-layer Llama ``config.json``: a model folder for vLLM's argument handling (no weights read).
TINY_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 256,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
}


class EngineStartReached(Exception):
    """Raised where ``run_headless`` goes on to start engine processes: the drivers stop there."""


class _StopAtEngineStart:
    """The engine config's ``parallel_config`` as far as ``run_headless`` reads it before the engines
    start: one local engine; reading ``node_rank_within_dp`` (the line after the signal handlers, in
    0.24-0.33) ends the run."""

    data_parallel_size_local = 1

    @property
    def node_rank_within_dp(self) -> int:
        raise EngineStartReached


def run_headless_in_a_thread(context_device: str = "cpu") -> dict[str, Any]:
    """Run vLLM's own ``run_headless`` in a fresh thread, as verl starts it in a Ray actor, up to where it
    would start the engine processes; what happened: ``error`` (None when the run reached the engine
    start) and the process's SIGTERM/SIGINT handlers ``before`` and ``after``.

    ``args`` come from vLLM's own ``serve`` parser (``--headless``) and ``AsyncEngineArgs.from_cli_args``;
    only ``create_engine_config`` (model and device resolution) is stood in, by a config of one local
    engine that ends the run where engine processes would start.
    """
    import signal
    import threading
    from types import SimpleNamespace
    from unittest import mock

    import vllm
    from vllm.entrypoints.cli import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from ._cpu_stand_in import cpu_platform

    watched = (signal.SIGTERM, signal.SIGINT)
    outcome: dict[str, Any] = {"error": None, "before": {s: signal.getsignal(s) for s in watched}}
    # A local model folder for the whole run: vLLM's argument handling looks a model name up on the Hub.
    with tempfile.TemporaryDirectory(prefix="patchkit-headless-") as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(TINY_MODEL_CONFIG))
        with cpu_platform() if context_device == "cpu" else contextlib.nullcontext():
            args = serve.make_arg_parser(FlexibleArgumentParser()).parse_args(["--headless", "--model", model_dir])
        args.api_server_count = 0  # what verl sets before run_headless
        config = SimpleNamespace(parallel_config=_StopAtEngineStart())

        def run() -> None:
            try:
                serve.run_headless(args)
            except EngineStartReached:
                pass
            except BaseException as exc:  # the thread's error is the finding
                outcome["error"] = exc

        with mock.patch.object(vllm.AsyncEngineArgs, "create_engine_config", lambda self, **kwargs: config):
            worker = threading.Thread(target=run, name="patchkit-headless-check")
            worker.start()
            worker.join()
    outcome["after"] = {s: signal.getsignal(s) for s in watched}
    return outcome
