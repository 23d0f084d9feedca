"""The HTTP API: the only package that knows Starlette, requests and problem+json."""

# The logger of the one-line-per-request access log (groupbuy.api.middleware writes it,
# the command line configures it); here so configuring it does not import Starlette.
ACCESS_LOGGER = "groupbuy.access"
