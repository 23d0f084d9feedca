"""The project's developer commands: the renderers of the generated pages, the docs site's
hooks, the client's unasync step. Run from the repository's root; none of it is in the wheel.

    python -m scripts.api_reference --write docs/api.md
    python -m scripts.settings_docs
    python -m scripts.script_docs
"""
