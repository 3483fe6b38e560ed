"""The compatibility check: our use of SGLang (async_generate keywords, sampling keys, ServerArgs fields,
modules, members, literals, KV event layout, flag names) against the pinned SGLang source, read with
``ast`` (no torch, no GPU). The pinned wheel is downloaded once into ~/.cache/dynamo-sglang."""

from __future__ import annotations

import inspect
import shutil
import tomllib
from pathlib import Path

import pytest
from dynamo_worker.sglang import compat, uses

from tests.support.sglang_fake import FakeSglangEngine

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def sglang_src() -> Path:
    return compat.fetch_sglang_source()


def test_our_code_matches_the_pinned_sglang(sglang_src):
    assert compat.check(sglang_src) == []


def test_a_wrong_async_generate_keyword_fails_the_check(sglang_src, tmp_path):
    original = (uses.PACKAGE_DIR / "handler.py").read_text()
    assert "        rid=rid,\n" in original
    broken = tmp_path / "handler.py"
    broken.write_text(original.replace("        rid=rid,\n", "        request_id=rid,\n", 1))
    problems = compat.check(sglang_src, handler_path=broken)
    assert problems == ["Engine.async_generate has no 'request_id'"]


def test_a_wrong_sampling_key_and_server_args_field_fail_the_check(sglang_src, tmp_path):
    package = tmp_path / "sglang_pkg"
    shutil.copytree(uses.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    handler = package / "handler.py"
    handler.write_text(handler.read_text().replace('"min_p": s.min_p', '"minimum_p": s.min_p', 1))
    engine = package / "engine.py"
    engine.write_text(engine.read_text().replace("server_args.page_size", "server_args.page_sz", 1))
    problems = compat.check(sglang_src, handler_path=handler, package_dir=package)
    assert "SamplingParams has no 'minimum_p'" in problems
    assert "ServerArgs has no 'page_sz'" in problems


def test_a_missing_module_or_member_is_reported(sglang_src):
    index = compat.SourceIndex(sglang_src)
    assert compat.check_use(index, uses.Use("sglang.srt.no_such_module", by="t")).startswith("module")
    gone = uses.Use("sglang.srt.entrypoints.engine", "Engine", "no_such_method", by="t")
    assert "has no member no_such_method" in compat.check_use(index, gone)


def test_the_fake_engine_has_the_real_async_generate_signature(sglang_src):
    index = compat.SourceIndex(sglang_src)
    real = index.members("sglang.srt.entrypoints.engine", "Engine")["async_generate"]
    real_names = [a.arg for a in real.args.args]
    fake_names = list(inspect.signature(FakeSglangEngine.async_generate).parameters)
    assert fake_names == real_names


def test_the_pin_here_is_the_pin_of_the_sglang_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"sglang=={uses.SGLANG_VERSION}" in extras["sglang"]


def test_compat_cli_reports_ok(sglang_src, capsys):
    assert compat.main(["--sglang-src", str(sglang_src)]) == 0
    assert "OK" in capsys.readouterr().out


def test_compat_cli_rejects_a_folder_without_sglang(tmp_path, capsys):
    assert compat.main(["--sglang-src", str(tmp_path)]) == 1
    assert "holds no sglang/" in capsys.readouterr().out


def test_the_fakes_bootstrap_host_is_sglangs(sglang_src):
    import ast

    from tests.support.sglang_fake import FAKE_BOOTSTRAP_HOST

    index = compat.SourceIndex(sglang_src)
    node = index.top_level("sglang.srt.disaggregation.utils")["FAKE_BOOTSTRAP_HOST"]
    assert isinstance(node, ast.Assign) and node.value.value == FAKE_BOOTSTRAP_HOST


def test_a_corrupt_cached_wheel_is_named_with_the_fix_and_leaves_no_staging_folder(tmp_path):
    wheel = tmp_path / "dl" / f"sglang-{uses.SGLANG_VERSION}-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"an interrupted download")
    with pytest.raises(compat.CompatError, match="delete it so that the next run downloads it again") as e:
        compat.fetch_sglang_source(cache_dir=tmp_path)
    assert str(wheel) in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dl"]
