"""Output: from the worker's token ids to the bytes of the answer. Detokenization and stop strings,
reasoning and tool-call parsing, and OpenAI's response bodies and SSE events. Pure: no I/O, no clock."""
