"""One lock file for the GPU pins (images/gpu-lock.txt): the CUDA image and the GPU proofs' install both
read it (through hack/gpu-lock.py), so the image ships what the proofs ran, and no pin of it is written
anywhere else in the image's build or the proofs' install. Every line is an exact pin with who installs
it, SGLang is a release of the worker's window, and the engine the image gets is the one the proofs ran."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from dynamo_worker.sglang.uses import SGLANG_WINDOW

from tests.support.gpu_lock import LOCK, READER, ROOT, reader

# What builds the CUDA image and what installs the GPU proofs: none may pin a version of its own.
CONSUMERS: list[Path] = [
    ROOT / "images" / "runtime" / "Dockerfile",
    ROOT / "hack" / "build-runtime-image.sh",
    ROOT / "hack" / "image-lib.sh",
    ROOT / "Makefile",
    *sorted((ROOT / "tests" / "gpu").glob("*.sh")),
]
gpu_lock = reader()
PINS = gpu_lock.read(LOCK)


def _pin(name: str):
    return next(p for p in PINS if p.key == name)


def test_every_line_is_an_exact_pin_with_who_installs_it(tmp_path):
    assert len({p.key for p in PINS}) == len(PINS), "a package is pinned twice"
    bad = tmp_path / "lock.txt"
    bad.write_text("sglang>=0.5.17  # image\n")
    with pytest.raises(SystemExit, match="not NAME==VERSION"):
        gpu_lock.read(bad)
    bad.write_text("sglang==0.5.17\n")
    with pytest.raises(SystemExit, match="who installs it"):
        gpu_lock.read(bad)


def test_the_image_gets_the_engine_the_proofs_ran():
    """SGLang itself is installed by both; the engine packages the proofs install (kernels, NIXL,
    xgrammar, flashinfer) reach the image through SGLang or nixl[cu13], held to the same line by the
    image's constraints (every pin, without extras)."""
    image = {p.key for p in PINS if "image" in p.users}
    device = {p.key for p in PINS if "device" in p.users}
    assert {"sglang", "torch", "nixl"} <= image
    assert {"sglang", "sglang-kernel", "flashinfer-python", "xgrammar", "nixl-cu13", "smg"} <= device
    assert _pin("nixl").version == _pin("nixl-cu13").version, "the image's NIXL is the proofs' NIXL"
    release = tuple(int(part) for part in _pin("sglang").version.split("."))
    oldest, newest = (tuple(int(part) for part in v.split(".")) for v in SGLANG_WINDOW)
    assert oldest <= release <= newest, "the image's SGLang is a release of the worker's window"


def test_the_image_reads_the_lock():
    dockerfile = (ROOT / "images" / "runtime" / "Dockerfile").read_text()
    cuda = dockerfile[dockerfile.index("AS cuda") :]
    assert "COPY images/gpu-lock.txt" in cuda and "COPY hack/gpu-lock.py" in cuda
    assert re.search(r"gpu-lock\.py image\b", cuda) and re.search(r"gpu-lock\.py constraints\b", cuda)
    assert re.search(r"pip install .*\n?.*-c /tmp/dynamo-sglang/gpu-constraints\.txt", cuda)
    ignore = (ROOT / "images" / "runtime" / "Dockerfile.dockerignore").read_text().split()
    assert "!images/gpu-lock.txt" in ignore and "!hack/gpu-lock.py" in ignore


@pytest.mark.parametrize("script", ["prepare.sh", "pack.sh", "install.sh"])
def test_the_proofs_install_reads_the_lock(script):
    assert READER in (ROOT / "tests" / "gpu" / script).read_text()


@pytest.mark.parametrize("consumer", CONSUMERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_pin_is_written_twice(consumer):
    """A version of the lock next to its package's name (``sglang==X``, ``SGLANG_VERSION=X``, "SGLang
    X") in a file that builds the image or installs the proofs is a second copy of the pin."""
    text = consumer.read_text().lower().replace("_", "-")
    copies = [
        f"{p.name}=={p.version}"
        for p in PINS
        if re.search(
            re.escape(p.key) + r"[a-z-]{0,10}[\s=:\"'-]{1,3}v?" + re.escape(p.version) + r"(?![0-9a-z.])",
            text,
        )
    ]
    assert copies == [], f"{consumer.relative_to(ROOT)} repeats {copies}: read them from {READER}"


def test_the_image_is_held_to_every_pin_but_the_proofs_tools(capsys):
    assert gpu_lock.main(["constraints"]) == 0
    constraints = capsys.readouterr().out.split()
    assert all("[" not in c for c in constraints), "pip refuses extras in a constraints file"
    assert {c.split("==")[0] for c in constraints} == {p.name for p in PINS if "tool" not in p.users}
    assert {"smg", "grpcio-health-checking"} <= {p.name for p in PINS if "tool" in p.users}
    assert gpu_lock.main(["device", "smg", "py-spy"]) == 0
    assert capsys.readouterr().out.split() == [
        f"smg=={_pin('smg').version}",
        f"py-spy=={_pin('py-spy').version}",
    ]
