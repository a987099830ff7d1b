"""The wire formats `--compress` may name, without torch (the options are read before it)."""

CODECS = ("none", "bf16", "fp16", "int8")
