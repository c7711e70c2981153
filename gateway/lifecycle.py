"""Start-up and shutdown: Triton up, models loaded, golden answers checked; SIGTERM drains, then stops Triton."""

from __future__ import annotations

import asyncio
import logging

from .readiness import check_golden, prepare_heads
from .runtime import Runtime, ServedModel
from .supervisor import TritonProcess
from .triton import Triton, TritonFailure

log = logging.getLogger("sr_gateway.lifecycle")


class Lifecycle:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.process: TritonProcess | None = None
        self.task: asyncio.Task[None] | None = None

    def _triton_exited(self, code: int) -> None:
        self.runtime.fail_all(f"tritonserver exited with code {code}")

    async def start(self) -> None:
        """Runs in the background so /health/live answers while models load."""
        self.task = asyncio.create_task(self._start())

    async def _start(self) -> None:
        settings = self.runtime.settings
        url = settings.triton_url
        try:
            if not url:
                self.process = TritonProcess(settings.model_repository, grpc_port=settings.triton_grpc_port,
                                             threads=settings.threads, on_exit=self._triton_exited)
                await self.process.start()
                url = self.process.url
            self.runtime.triton = Triton(url)
            await self.runtime.triton.wait_live(settings.triton_startup_seconds)
        except (TritonFailure, OSError, RuntimeError) as exc:
            log.error("Triton did not start: %s", exc)
            self.runtime.fail_all(f"Triton did not start: {exc}")
            return
        await asyncio.gather(*(self._bring_up(m) for m in self.runtime.models.values()))

    async def _bring_up(self, model: ServedModel) -> None:
        runtime = self.runtime
        assert runtime.triton is not None
        try:
            runtime.set_status(model, "loading")
            model.load_tokenizer()
            await runtime.triton.load(model.card.triton_name)
            config = await runtime.triton.model_config(model.card.triton_name)
            model.output = next(o["name"] for o in config.get("output", []) if o["name"] != "TIMING")
            model.engine_args = {
                "triton_model": model.card.triton_name, "backend": config.get("backend"),
                "max_batch_size": config.get("max_batch_size"),
                "dynamic_batching": config.get("dynamic_batching", {}),
                "instance_group": config.get("instance_group", []),
            }
            runtime.set_status(model, "warming")
            await asyncio.to_thread(lambda: model.text_encoder().facts)  # probe the tokenizer's cut rules once
            await prepare_heads(runtime, model)
            await check_golden(runtime, model)
        except Exception as exc:  # any failure is this model's reason, the process keeps serving
            log.error("model %s failed: %s", model.id, exc)
            if model.status == "warming":  # it got as far as its golden check
                model.golden = {**model.golden, "status": "failed"}
            runtime.set_status(model, "failed", f"{type(exc).__name__}: {exc}")
            return
        runtime.set_status(model, "ready")
        labels = (model.id, model.card.revision or "", model.card.family, "triton/onnxruntime", "cpu",
                  model.card.numerics)
        runtime.metrics.model_info.labels(*labels).set(1)
        log.info("model %s is ready", model.id)

    async def stop(self) -> None:
        self.runtime.draining = True
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.runtime.triton is not None:
            await self.runtime.triton.close()
        if self.process is not None:
            await self.process.stop()
