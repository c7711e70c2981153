"""`sr-gateway models build --target gpu` on a machine without a GPU: a clear refusal before anything changes, and
the GPU configs themselves (--configs-only), which need no GPU to write."""

from __future__ import annotations

import subprocess
from pathlib import Path

from sr_build.gpu import build_gpu_repository, gpu_config
from sr_common.tuned_config import generated_config, write_generated

from .conftest import BIN, ROOT
from .test_serve_process import copy_model


def test_target_gpu_without_tensorrt_fails_clearly_and_changes_nothing(tmp_path: Path) -> None:
    copy_model(tmp_path, "all-minilm-l6-v2")
    config = (tmp_path / "all-minilm-l6-v2" / "config.pbtxt").read_text()
    done = subprocess.run([str(BIN / "sr-gateway"), "models", "build", "--model-repository", str(tmp_path),
                           "--target", "gpu"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "--target gpu needs ONNX Runtime with the TensorRT execution provider" in done.stderr
    assert (tmp_path / "all-minilm-l6-v2" / "config.pbtxt").read_text() == config


def test_gpu_configs_put_text_models_on_one_gpu_instance_with_a_profile_for_ragged_batches(tmp_path: Path) -> None:
    copy_model(tmp_path, "all-minilm-l6-v2")
    (variant,) = build_gpu_repository(tmp_path, plans=False)
    assert variant.model == "all-minilm-l6-v2" and variant.plans is False
    config = (tmp_path / "all-minilm-l6-v2" / "config.pbtxt").read_text()
    assert "instance_group [ { kind: KIND_GPU, count: 1 } ]" in config and "KIND_CPU" not in config
    # the ONNX inputs' names, up to 256 rows x the card's max_input_tokens (256 for MiniLM)
    assert ('parameters: { key: "trt_profile_max_shapes", value: { string_value: '
            '"input_ids:256x256,attention_mask:256x256" } }') in config
    assert 'key: "trt_profile_opt_shapes", value: { string_value: "input_ids:64x128,attention_mask:64x128" }' in config
    assert 'key: "execution_provider", value: { string_value: "tensorrt" }' in config
    assert 'key: "onnx_file", value: { string_value: "model.onnx" }' in config  # the rest is kept
    assert (tmp_path / "all-minilm-l6-v2" / "1" / "gpu.json").is_file()


def test_gpu_config_replaces_a_parameter_instead_of_repeating_it() -> None:
    source = (ROOT / "model_repository" / "all-minilm-l6-v2" / "config.pbtxt").read_text()
    once = gpu_config(source, {"trt_fp16": "1"})
    twice = gpu_config(once, {"trt_fp16": "0"})
    assert twice.count('key: "trt_fp16"') == 1 and 'string_value: "0"' in twice.split('key: "trt_fp16"')[1]


def test_a_model_moved_to_the_gpu_loses_the_cpu_choice_tuning_generated_for_it(tmp_path: Path) -> None:
    copy_model(tmp_path, "all-minilm-l6-v2")
    model_dir = tmp_path / "all-minilm-l6-v2"
    write_generated(model_dir, {"engine": "openvino", "precision": "fp32", "threads": "2", "instances": "2"})
    build_gpu_repository(tmp_path, plans=False)
    # tritonserver --model-config-name=tuned falls back to config.pbtxt: the GPU variant, not the CPU choice
    assert not generated_config(model_dir).exists()
    assert "KIND_GPU" in (model_dir / "config.pbtxt").read_text()
