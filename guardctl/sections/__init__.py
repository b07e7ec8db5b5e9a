"""Configuration sections, one file per ``[section]`` of guardctl.toml.

Each section is a frozen dataclass with defaults; ``__post_init__`` rejects
values that are well-typed but wrong (a negative interval, a fraction above 1)
with a ValueError that :mod:`guardctl.config` turns into a ConfigError naming
the file and the key.
"""
