"""The HTTP API: the only package that knows Starlette, requests and problem+json."""
