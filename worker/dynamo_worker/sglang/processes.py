"""The SGLang engine's processes: starting it in this process (``sglang_engine``), naming and killing
its children (``process_name``, ``kill_sglang_children``), the signal handlers it replaces, and what
it leaves in this process after a shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import Any

__all__ = ["kill_sglang_children", "process_name", "sglang_engine"]

log = logging.getLogger(__name__)

MODEL_CARD_PATTERNS = ["*.json", "*.jinja", "tokenizer.model"]


def kill_sglang_children() -> None:
    """SIGKILL every child process of this one (SGLang's schedulers and detokenizer)."""
    from sglang.srt.utils.common import kill_process_tree

    kill_process_tree(None, include_parent=False)


def sglang_engine(server_args: Any) -> Any:
    import sglang.srt.entrypoints.engine as sgl_engine

    return sgl_engine.Engine(server_args=server_args)


def _model_dir(path: str) -> Path | None:
    """The folder with the tokenizer files for the model card: ``path`` itself, or the hub snapshot."""
    local = Path(path)
    if local.is_dir():
        return local
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, allow_patterns=MODEL_CARD_PATTERNS))
    except Exception as e:  # no hub access: serve without a card; the frontend says it has no tokenizer
        log.warning("Could not fetch tokenizer files for the model card model=%s error=%r", path, e)
        return None


def _signal_handlers(loop: asyncio.AbstractEventLoop) -> dict[int, Any]:
    """The loop's SIGTERM and SIGQUIT handlers (asyncio keeps them on the loop): the worker's own, which
    SGLang's tokenizer manager replaces when its handle loop starts (SIGQUIT: with one that kills this
    whole process tree when a child fails; ours reports the engine's death instead)."""
    handlers = getattr(loop, "_signal_handlers", {})
    return {sig: handlers.get(sig) for sig in (signal.SIGTERM, signal.SIGQUIT)}


def _restore_signal_handlers(loop: asyncio.AbstractEventLoop, before: dict[int, Any]) -> None:
    for sig, handle in before.items():
        if handle is not None:
            loop.add_signal_handler(sig, handle._callback, *handle._args)
        else:
            loop.remove_signal_handler(sig)
    log.info("Kept the worker's SIGTERM and SIGQUIT handling (SGLang's tokenizer manager installs its own)")


def process_name(cmdline: str, pid: int) -> str:
    """An SGLang process's name from its title (``sglang::scheduler_TP0`` -> ``scheduler_TP0``). Pure."""
    for word in cmdline.split():
        if word.startswith("sglang::"):
            return word.removeprefix("sglang::")
    return f"process_{pid}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


async def _release_in_process_parts(tokenizer_manager: Any, within_s: float = 5.0) -> None:
    """What a stopped SGLang engine leaves in this process, released so a new one can start here: its
    tokenizer manager's tasks on our loop (the handle loop waits on the dead detokenizer forever) and the
    prefill bootstrap server (a thread holding the bootstrap port)."""
    for task in list(getattr(tokenizer_manager, "asyncio_tasks", None) or ()):
        if isinstance(task, asyncio.Task) and not task.done():
            task.cancel()
    server = getattr(tokenizer_manager, "bootstrap_server", None)
    close = getattr(server, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):  # a server whose bind failed has nothing to close
            close()
        thread = getattr(server, "thread", None)
        if thread is not None and thread.is_alive():
            await asyncio.to_thread(thread.join, within_s)
