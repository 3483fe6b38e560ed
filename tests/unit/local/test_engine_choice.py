"""dynamo_worker.local.engine_choice: --engine auto picks SGLang only when it is importable and GPUs are
visible, and says why; GPU ids come from CUDA_VISIBLE_DEVICES, else nvidia-smi."""

from __future__ import annotations

from dynamo_worker.local.engine_choice import HostFacts, choose_engine, visible_gpus

NO_SGLANG = HostFacts(sglang_importable=False, gpus=("0",), gpu_source="nvidia-smi -L")
NO_GPU = HostFacts(sglang_importable=True, gpus=(), gpu_source="CUDA_VISIBLE_DEVICES=''")
BOTH = HostFacts(sglang_importable=True, gpus=("0", "1"), gpu_source="nvidia-smi -L")


def test_auto_picks_sglang_only_with_sglang_and_gpus_and_gives_the_reason():
    assert choose_engine("auto", BOTH).engine == "sglang"
    assert "2 GPUs" in choose_engine("auto", BOTH).reason
    no_sglang = choose_engine("auto", NO_SGLANG)
    assert no_sglang.engine == "mocker" and "sglang is not installed" in no_sglang.reason
    no_gpu = choose_engine("auto", NO_GPU)
    assert no_gpu.engine == "mocker" and "no GPU is visible" in no_gpu.reason


def test_an_explicit_engine_is_obeyed():
    assert choose_engine("mocker", BOTH).engine == "mocker"
    assert choose_engine("sglang", NO_GPU).engine == "sglang"


def test_visible_gpus_prefers_cuda_visible_devices():
    assert visible_gpus("2,3", 8) == (("2", "3"), "CUDA_VISIBLE_DEVICES='2,3'")
    assert visible_gpus("", 8)[0] == ()
    assert visible_gpus("-1", 8)[0] == ()
    assert visible_gpus(None, 2) == (("0", "1"), "nvidia-smi -L")
    assert visible_gpus(None, None)[0] == ()
