"""Contract tests: one per private or undocumented hook of a library the code relies on.

Each test is named after the hook and says in its docstring which production function
relies on it. An upgrade that changes a hook fails here, by name. docs/architecture.md
("Private hooks and their contract tests") lists them; pyproject.toml pins the versions
they were run on.
"""
