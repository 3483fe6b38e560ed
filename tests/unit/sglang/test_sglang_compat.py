"""The compatibility check against the oldest and the newest SGLang of the window (their wheels'
source, read with ``ast``; no torch, no GPU): it passes on both although their ``ServerArgs`` layouts
differ (a dataclass in 0.5.17, a ``msgspec.defstruct`` from ``arg_groups/fields/`` in 0.5.23), and it
fails on real breaks: a KV event struct whose encoding or fields change, a ServerArgs field the worker
reads that is gone, a keyword or sampling key SGLang does not have. The window is declared once; the
``[sglang]`` extra and the list of removed flags agree with it."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import tomllib
from pathlib import Path

import pytest
from dynamo_worker.sglang import compat, uses
from dynamo_worker.sglang.source import SourceIndex, server_args_layout

from tests.support.sglang_fake import FAKE_BOOTSTRAP_HOST, FakeSglangEngine

ROOT = Path(__file__).resolve().parents[3]
OLDEST, NEWEST = uses.SGLANG_WINDOW
KV_EVENTS = Path("sglang/srt/disaggregation/kv_events.py")


def test_our_code_matches_both_ends_of_the_window(sglang_sources):
    for version, src in sglang_sources.items():
        assert compat.check(src) == [], version


def test_each_release_is_read_in_its_own_layout(oldest_src, newest_src):
    assert compat.describe(oldest_src) == (
        "ServerArgs dataclass, resolved values from fields, KV events as tagged arrays"
    )
    assert compat.describe(newest_src) == (
        "ServerArgs defstruct, resolved values from resolved_dict(), KV events as tagged maps"
    )


def broken_copy(src: Path, dest: Path, edits: dict[Path, tuple[str, str]]) -> Path:
    """``src`` as symlinks, except the edited files: real copies with one text replaced."""
    shutil.copytree(src, dest, copy_function=os.symlink)
    for rel, (old, new) in edits.items():
        text = (src / rel).read_text()
        assert text.count(old) >= 1, (rel, old)
        (dest / rel).unlink()
        (dest / rel).write_text(text.replace(old, new))
    return dest


def test_a_kv_event_field_renamed_in_the_map_encoding_fails(newest_src, tmp_path):
    edit = {KV_EVENTS: ("    token_ids: list[int]\n", "    tokens: list[int]\n")}
    problems = compat.check(broken_copy(newest_src, tmp_path / "sglang", edit))
    assert (
        f"{uses.KV_EVENTS_MODULE}.BlockStored has no field 'token_ids' (kv_events.py reads it by name)"
        in problems
    )
    assert any(p.startswith("SGLang's KV event structs cannot be built") for p in problems)


def test_a_kv_event_field_moved_in_the_array_encoding_fails(oldest_src, tmp_path):
    edit = {
        KV_EVENTS: (
            "    parent_block_hash: Optional[int]\n    token_ids: list[int]\n",
            "    token_ids: list[int]\n    parent_block_hash: Optional[int]\n",
        )
    }
    problems = compat.check(broken_copy(oldest_src, tmp_path / "sglang", edit))
    assert any("BlockStored encodes as an array of" in p for p in problems)
    assert any(p.startswith("kv_events.py") for p in problems)  # the round trip decodes it wrong


def test_a_kv_event_tag_field_change_fails(newest_src, tmp_path):
    edit = {
        KV_EVENTS: (
            "    omit_defaults=True,  # type: ignore[call-arg]\n",
            "    omit_defaults=True,\n    tag_field='kind',\n",
        )
    }
    problems = compat.check(broken_copy(newest_src, tmp_path / "sglang", edit))
    assert (
        f"{uses.KV_EVENTS_MODULE}.BlockStored puts its tag in 'kind'; kv_events.py reads 'type'" in problems
    )
    assert any(p.startswith("kv_events.py cannot decode a batch SGLang encodes") for p in problems)


def test_a_server_args_field_gone_from_the_defstruct_layout_fails(newest_src, tmp_path):
    parallel = Path("sglang/srt/arg_groups/fields/parallel.py")
    edit = {parallel: ("    dp_size: A[\n", "    replica_count: A[\n")}
    problems = compat.check(broken_copy(newest_src, tmp_path / "sglang", edit))
    assert problems == ["ServerArgs has no 'dp_size'"]


def test_the_config_merger_gone_from_both_paths_fails(newest_src, tmp_path):
    dest = broken_copy(newest_src, tmp_path / "sglang", {})
    (dest / "sglang/srt/utils/server_args_config_parser.py").unlink()
    problems = compat.check(dest)
    assert len(problems) == 1 and problems[0].startswith("none of sglang.srt.utils.server_args_config_parser")


def test_a_wrong_async_generate_keyword_fails_the_check(newest_src, tmp_path):
    original = (uses.PACKAGE_DIR / "handler.py").read_text()
    assert "        rid=rid,\n" in original
    broken = tmp_path / "handler.py"
    broken.write_text(original.replace("        rid=rid,\n", "        request_id=rid,\n", 1))
    problems = compat.check(newest_src, handler_path=broken)
    assert problems == ["Engine.async_generate has no 'request_id'"]


def test_a_wrong_sampling_key_and_server_args_field_fail_the_check(oldest_src, tmp_path):
    package = tmp_path / "sglang_pkg"
    shutil.copytree(uses.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    handler = package / "handler.py"
    handler.write_text(handler.read_text().replace('"min_p": s.min_p', '"minimum_p": s.min_p', 1))
    engine = package / "engine.py"
    engine.write_text(
        engine.read_text().replace("self.server_args.model_path", "self.server_args.model_pth", 1)
    )
    problems = compat.check(oldest_src, handler_path=handler, package_dir=package)
    assert "SamplingParams has no 'minimum_p'" in problems
    assert "ServerArgs has no 'model_pth'" in problems


def test_a_missing_module_or_member_is_reported(newest_src):
    index = SourceIndex(newest_src)
    assert compat.check_use(index, uses.Use("sglang.srt.no_such_module", by="t")).startswith("module")
    gone = uses.Use("sglang.srt.entrypoints.engine", "Engine", "no_such_method", by="t")
    assert "has no member no_such_method" in compat.check_use(index, gone)


def test_every_resolved_field_is_a_field_of_both_releases(sglang_sources):
    for src in sglang_sources.values():
        fields = server_args_layout(SourceIndex(src)).fields
        assert set(uses.RESOLVED_FIELDS) <= set(fields)
    assert "attn_dp_size" in server_args_layout(SourceIndex(sglang_sources[NEWEST])).fields
    assert "attn_dp_size" not in server_args_layout(SourceIndex(sglang_sources[OLDEST])).fields


def test_the_removed_flags_are_the_oldest_releases_flags_the_newest_lacks(oldest_src, newest_src):
    old = server_args_layout(SourceIndex(oldest_src)).flags()
    new = server_args_layout(SourceIndex(newest_src)).flags()
    assert old - new == uses.REMOVED_FLAGS
    assert {
        "--enable-prefill-context-parallel",
        "--torchao-config",
        "--enable-expert-distribution-metrics",
    } <= (uses.REMOVED_FLAGS)
    for flag, replacement in uses.FLAG_REPLACEMENTS.items():
        spelled = set(re.findall(r"--[a-z-]+", replacement))
        assert spelled <= old or spelled <= new, (flag, replacement)


def test_the_fake_engine_has_the_oldest_releases_async_generate_signature(oldest_src):
    index = SourceIndex(oldest_src)
    real = index.members("sglang.srt.entrypoints.engine", "Engine")["async_generate"]
    real_names = [a.arg for a in real.args.args]
    fake_names = list(inspect.signature(FakeSglangEngine.async_generate).parameters)
    assert fake_names == real_names


def test_the_fakes_bootstrap_host_is_sglangs(sglang_sources):
    import ast

    for src in sglang_sources.values():
        node = SourceIndex(src).top_level("sglang.srt.disaggregation.utils")["FAKE_BOOTSTRAP_HOST"]
        assert isinstance(node, ast.Assign) and node.value.value == FAKE_BOOTSTRAP_HOST


def test_the_window_here_is_the_window_of_the_sglang_extra_and_the_docs():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["sglang"] == [f"sglang>={OLDEST},<={NEWEST}"]
    for doc in ("README.md", "tests/gpu/README.md"):
        assert f"SGLang {OLDEST} to {NEWEST}" in (ROOT / doc).read_text(), doc


def test_compat_cli_reports_ok_and_how_it_read_the_release(newest_src, capsys):
    assert compat.main(["--sglang-src", str(newest_src)]) == 0
    assert "OK: our use of SGLang matches" in capsys.readouterr().out


def test_compat_cli_checks_the_window_from_the_cache(sglang_sources, capsys):
    cache = next(iter(sglang_sources.values())).parent
    assert compat.main(["--window", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert f"matches SGLang {OLDEST}" in out and f"matches SGLang {NEWEST}" in out


def test_compat_cli_fails_on_a_broken_copy(newest_src, tmp_path, capsys):
    edit = {KV_EVENTS: ("    token_ids: list[int]\n", "    tokens: list[int]\n")}
    assert compat.main(["--sglang-src", str(broken_copy(newest_src, tmp_path / "sglang", edit))]) == 1
    assert "INCOMPATIBLE: " in capsys.readouterr().out


def test_compat_cli_rejects_a_folder_without_sglang(tmp_path, capsys):
    assert compat.main(["--sglang-src", str(tmp_path)]) == 1
    assert "holds no sglang/" in capsys.readouterr().out


def test_a_corrupt_cached_wheel_is_named_with_the_fix_and_leaves_no_staging_folder(tmp_path):
    wheel = tmp_path / "dl" / f"sglang-{NEWEST}-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"an interrupted download")
    with pytest.raises(compat.CompatError, match="delete it so that the next run downloads it again") as e:
        compat.fetch_sglang_source(NEWEST, cache_dir=tmp_path)
    assert str(wheel) in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dl"]
