"""Tool-call parsers, chosen by the worker's ``--tool-call-parser`` (SGLang's names), published in
its model card. ``TOOL_PARSERS`` maps every supported name to its parser; ``gpt-oss`` is handled by
``output.harmony`` together with reasoning."""

from __future__ import annotations

from dynamo_worker.frontend.output.tools.base import Parsed, ToolCall, ToolParser
from dynamo_worker.frontend.output.tools.formats import (
    DeepSeekV3Parser,
    DeepSeekV31Parser,
    HermesParser,
    Llama3Parser,
    MistralParser,
)

__all__ = ["HARMONY_PARSER", "TOOL_PARSERS", "Parsed", "ToolCall", "ToolParser", "supported_tool_parsers"]

HARMONY_PARSER = "gpt-oss"
TOOL_PARSERS: dict[str, ToolParser] = {
    name: parser()
    for parser in (Llama3Parser, HermesParser, MistralParser, DeepSeekV3Parser, DeepSeekV31Parser)
    for name in parser.names
}


def supported_tool_parsers() -> list[str]:
    return sorted([*TOOL_PARSERS, HARMONY_PARSER])
